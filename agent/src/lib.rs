//! The node side of mProv (`mprov-agent`).
//!
//! As `/init` in the initramfs it loads the NIC drivers, runs DHCP, enrolls with
//! the one-time nonce, streams and verifies the compressed root image and
//! `switch_root`s into it. After boot it runs the post-boot scripts, renews its
//! certificate and, on unknown nodes, discovers the switch port over LLDP (NADS).
//!
//! Status: skeleton. Nothing here runs yet; issue 5 starts the `/init` steps.
