//! Writes cpio newc archives and builds the agent's initramfs with the NIC driver
//! modules (and their dependencies) taken from a kernel's own module tree.
//!
//! Architecture invariant: this is a pure library. No async runtime, no sockets;
//! everything it does is a function from inputs to bytes, so it can be tested
//! without root and without a network.
//!
//! Status: skeleton. Nothing here runs yet; issue 5 builds it.
