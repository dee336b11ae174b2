//! Unpacking tar streams into a root: the shared unpacker ([`mprov_unpack`],
//! also used by the node agent), plus [`unpack_file`] for `mprov-image
//! unpack` and the benchmark, with a progress bar.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

pub use mprov_unpack::{ReadAhead, UnpackError, UnpackOptions, Unpacked, confine, unpack};

fn create_err(path: PathBuf, err: std::io::Error) -> UnpackError {
    UnpackError::Create { path, err }
}

/// Unpacks a `rootfs.tar.zst` into `root` (created if missing), with owners
/// when running as root.
pub fn unpack_file(
    archive: &Path,
    root: &Path,
    show_progress: bool,
) -> Result<Unpacked, UnpackError> {
    let read_err = |err| UnpackError::Read { err };
    let file = File::open(archive).map_err(|err| create_err(archive.to_path_buf(), err))?;
    let total = file.metadata().map_err(read_err)?.len();
    fs::create_dir_all(root).map_err(|err| create_err(root.to_path_buf(), err))?;
    let bar = crate::progress::bytes_bar(total, "unpacking", show_progress);
    let decoder = zstd::Decoder::new(bar.wrap_read(file)).map_err(read_err)?;
    let options = UnpackOptions {
        whiteouts: false,
        preserve_owner: nix::unistd::geteuid().is_root(),
    };
    let done = std::thread::scope(|scope| {
        let (reader, feeder) = ReadAhead::new(decoder);
        scope.spawn(feeder);
        unpack(reader, root, options)
    })?;
    bar.finish_and_clear();
    Ok(done)
}
