//! DNS server: skeleton, being built.
