//! The job modules: what a claimed job runs. Each is a plain async function
//! of its context, a control-service [`Client`](mprov_api::client::Client),
//! the job's parameters and a progress sink for the job's output.
//!
//! - [`image_update`]: builds an image version from the inventory and
//!   publishes it.
//! - [`image_sync`]: copies a published version from another job server,
//!   verified against the control service's record.

pub mod image_sync;
pub mod image_update;
