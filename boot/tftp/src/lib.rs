//! TFTP server: skeleton, being built.
