//! The boot storm's faults (`mprov_tests::storm`), at 40 nodes: the job
//! server killed with SIGKILL mid-storm and started again on its state,
//! and the control service restarted mid-storm. Either way every node
//! reaches ready, no node's lease is lost (the job server's lease log
//! holds each ready node's address bound to its MAC), no address is handed
//! to two nodes or a node moved to another, and every boot event a node
//! was told was stored is in its timeline, as are the job server's lease
//! report and downloads for it.

use anyhow::Result;
use mprov_tests::storm::{self, Fault, Report, StormOptions};

/// Nodes in each fault's storm.
const NODES: usize = 40;

/// A storm of [`NODES`] with `fault` (see [`StormOptions::fault`] for when).
fn storm_with(fault: Fault) -> Result<Report> {
    let out = tempfile::tempdir()?;
    storm::run(&StormOptions {
        fault: Some(fault),
        ..StormOptions::smoke(NODES, out.path())
    })
}

/// What both faults must leave: nothing lost.
fn nothing_lost(report: &Report) {
    let summary = report.summary();
    assert!(report.fault.is_some(), "no fault injected:\n{summary}");
    assert!(report.lost.is_empty(), "{summary}");
    assert_eq!(report.ready, NODES, "{summary}");
    assert!(report.duplicate_addresses.is_empty(), "{summary}");
    assert_eq!(report.moved_nodes, Vec::<String>::new(), "{summary}");
    assert_eq!(report.leases_missing, Vec::<String>::new(), "{summary}");
    assert_eq!(report.events_missing, 0, "{summary}");
    assert_eq!(report.events_failed, 0, "{summary}");
    assert_eq!(report.jobserver_events_missing, 0, "{summary}");
    assert!(report.clean(), "{summary}");
}

/// The job server killed with SIGKILL mid-storm: the lease reports it had
/// queued but not posted die with it, and the one started again on its
/// lease log reports again the leases it bound within `/ipxe/`'s
/// attestation window (`Server::recent_acks`), so no node is stranded
/// (found by this test: before, 35 of 40 nodes were refused their nonce
/// until the deadline).
#[test]
fn a_storm_rides_out_the_job_server_killed_and_restarted() -> Result<()> {
    let report = storm_with(Fault::KillJobServer)?;
    nothing_lost(&report);
    Ok(())
}

#[test]
fn a_storm_rides_out_the_control_service_restarted() -> Result<()> {
    let report = storm_with(Fault::RestartControl)?;
    nothing_lost(&report);
    Ok(())
}
