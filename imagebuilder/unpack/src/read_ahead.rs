//! Read-ahead: the unpacker's input, filled by a thread of its own.

use std::io::{self, BufRead, Read};

/// A reader fed by another thread, a few chunks ahead: decompression (and,
/// in the agent, the download and its hash) on a thread of its own, so it
/// overlaps with the system calls that create the files (as `zstd -dc | tar
/// x` overlaps two processes).
pub struct ReadAhead {
    chunks: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    /// Read chunks go back to the feeder to be filled again: no allocation
    /// (and, with musl, no `mmap` and page faults) per chunk.
    spare: std::sync::mpsc::Sender<Vec<u8>>,
    current: io::Cursor<Vec<u8>>,
}

impl ReadAhead {
    /// Chunks in flight at most.
    const DEPTH: usize = 4;
    /// The size of one chunk.
    pub const CHUNK: usize = 1024 * 1024;

    /// The reader, and the function that feeds it from `source` until the
    /// end, an error, or the reader is dropped (run it on another thread).
    pub fn new<R: Read + Send>(mut source: R) -> (Self, impl FnOnce() + Send) {
        let (tx, chunks) = std::sync::mpsc::sync_channel(Self::DEPTH);
        let (spare, spares) = std::sync::mpsc::channel::<Vec<u8>>();
        let feeder = move || {
            // Chunks made so far. Once there are as many as can be in
            // flight (the queue's, the reader's and this one), the reader
            // is sure to give one back: wait for it rather than make
            // another (fresh memory is a page fault per page, and an
            // unbounded number of chunks when the reader is slow to give
            // them back).
            let mut made = 0;
            loop {
                let spare = if made < Self::DEPTH + 2 {
                    spares.try_recv().ok()
                } else {
                    match spares.recv() {
                        Ok(chunk) => Some(chunk),
                        // The reader is gone.
                        Err(_) => break,
                    }
                };
                let mut chunk = match spare {
                    Some(mut chunk) => {
                        chunk.resize(Self::CHUNK, 0);
                        chunk
                    }
                    None => {
                        made += 1;
                        vec![0u8; Self::CHUNK]
                    }
                };
                let mut filled = 0;
                let result = loop {
                    match source.read(&mut chunk[filled..]) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            filled += n;
                            if filled == chunk.len() {
                                break Ok(());
                            }
                        }
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                        Err(err) => break Err(err),
                    }
                };
                chunk.truncate(filled);
                let end = filled < Self::CHUNK;
                let sent = match result {
                    Ok(()) if chunk.is_empty() => break,
                    Ok(()) => tx.send(Ok(chunk)),
                    Err(err) => {
                        let _ = tx.send(Ok(chunk));
                        tx.send(Err(err))
                    }
                };
                if sent.is_err() || end {
                    break;
                }
            }
        };
        let reader = Self {
            chunks,
            spare,
            current: io::Cursor::new(Vec::new()),
        };
        (reader, feeder)
    }
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead")
            .field(
                "buffered",
                &(self.current.get_ref().len() as u64 - self.current.position()),
            )
            .finish_non_exhaustive()
    }
}

impl Read for ReadAhead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

/// Its chunks as the buffer: a reader that wants one (zstd's decoder) needs
/// no copy of its own.
impl BufRead for ReadAhead {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.current.position() >= self.current.get_ref().len() as u64 {
            match self.chunks.recv() {
                Ok(chunk) => {
                    let used = std::mem::replace(&mut self.current, io::Cursor::new(chunk?));
                    // The feeder may be gone: then the chunk is just freed.
                    // (The first, empty, is not one of its chunks.)
                    let used = used.into_inner();
                    if used.capacity() > 0 {
                        let _ = self.spare.send(used);
                    }
                }
                // The feeder is done: end of stream.
                Err(_) => break,
            }
        }
        let at = usize::try_from(self.current.position()).unwrap_or(usize::MAX);
        Ok(self.current.get_ref().get(at..).unwrap_or(&[]))
    }

    fn consume(&mut self, n: usize) {
        self.current.consume(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_ahead_passes_every_byte_and_the_error() {
        let chunk = ReadAhead::CHUNK;
        // The last: more chunks than are ever in flight, so the feeder waits
        // for the reader to give chunks back and fills them again.
        for len in [
            0,
            1,
            chunk - 1,
            chunk,
            chunk + 1,
            3 * chunk + 17,
            20 * chunk + 3,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let out = std::thread::scope(|scope| {
                let (mut reader, feeder) = ReadAhead::new(&data[..]);
                scope.spawn(feeder);
                let mut out = Vec::new();
                reader.read_to_end(&mut out).map(|_| out)
            });
            assert!(out.unwrap() == data, "{len} bytes");
        }

        // A source that fails after some bytes: those bytes, then the error.
        let failing = (&[7u8; 10][..]).chain(FailingRead);
        let result = std::thread::scope(|scope| {
            let (mut reader, feeder) = ReadAhead::new(failing);
            scope.spawn(feeder);
            let mut out = Vec::new();
            let err = reader.read_to_end(&mut out).unwrap_err();
            (out, err)
        });
        assert_eq!(result.0, [7u8; 10]);
        assert_eq!(result.1.to_string(), "corrupt frame");

        // The reader going away early stops the feeder (the scope ends).
        let endless = io::repeat(1);
        std::thread::scope(|scope| {
            let (mut reader, feeder) = ReadAhead::new(endless);
            scope.spawn(feeder);
            let mut first = [0u8; 100];
            reader.read_exact(&mut first).unwrap();
        });
    }

    struct FailingRead;

    impl Read for FailingRead {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::other("corrupt frame"))
        }
    }
}
