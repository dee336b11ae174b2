//! DHCPv4 server: skeleton, being built.
