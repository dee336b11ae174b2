//! HTTP image server: skeleton, being built.
