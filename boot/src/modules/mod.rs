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

#[cfg(test)]
mod tests {
    use mprov_api::client::{Auth, Client};
    use serde_json::json;

    use super::*;

    fn is_send<T: Send>(_: &T) {}

    /// The daemon runs jobs on spawned tasks: the modules' futures must be
    /// `Send` (checked by the compiler; the futures are never polled).
    #[test]
    fn module_futures_are_send() {
        let client = Client::new("http://127.0.0.1:9", Auth::None).unwrap();
        let params = json!({});
        let update = image_update::UpdateContext::new("/nonexistent");
        let future = image_update::image_update(&update, &client, &params, &|_| {});
        is_send(&future);
        let sync = image_sync::SyncContext::new("/nonexistent");
        let future = image_sync::image_sync(&sync, &client, &params, &|_| {});
        is_send(&future);
    }
}
