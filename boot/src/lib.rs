//! The job server (`mprov-jobserver`): pure-Rust DHCPv4, DNS, TFTP and HTTP image
//! servers that answer everything a node asks before its kernel runs, fed live
//! from the control service's inventory, plus the job modules (image build, sync,
//! delete, genders).
//!
//! Status: skeleton. Nothing here runs yet; issue 3 builds the boot services.
