//! Renders iPXE scripts (boot, discovery, local boot, retry loops) and knows which
//! iPXE binary each firmware needs.
//!
//! Architecture invariant: this is a pure library. No async runtime, no sockets.
//!
//! Status: skeleton. Nothing here runs yet; the boot flow issues build it.
