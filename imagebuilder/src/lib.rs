//! `mprov-image`: builds node images from a root directory, an OCI or
//! `docker save` archive, or a distro bootstrap plus image-gen scripts, and packs
//! `rootfs.tar.zst`, the kernel and `manifest.json`.
//!
//! Status: skeleton. Nothing here runs yet; issue 5 builds it.
