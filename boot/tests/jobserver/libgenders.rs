//! `libgenders` against a real control service: the genders file it writes
//! from the inventory is read by the real `nodeattr` (Debian's `genders`
//! package), and rewritten when the inventory changes.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mprov_api::boot::BootConfig;
use mprov_api::client::{Auth, Client};
use mprov_control::db::Db;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{control, insert_api_key};

/// `nodeattr -f FILE ARGS...`: its standard output, split in words; it must
/// succeed.
fn nodeattr(file: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("nodeattr")
        .arg("-f")
        .arg(file)
        .args(args)
        .output()
        .expect("nodeattr (apt-get install genders)");
    assert!(
        out.status.success(),
        "nodeattr {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut words: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    words.sort();
    words
}

/// Waits (bounded) until `nodeattr ARGS` lists `want`.
async fn until_listed(file: &Path, args: &[&str], want: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if file.exists() && nodeattr(file, args) == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nodeattr {args:?} never listed {want:?}; the file:\n{}",
            std::fs::read_to_string(file).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_genders_file_answers_nodeattr_and_follows_the_inventory() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("c.sqlite3").display()
    );
    let db = Db::open(&url).await.unwrap();
    let key = insert_api_key(&db, "admin").await;
    db.pool().close().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_control, task) = control(&url, listener).await;
    let client = Client::new(&format!("http://{addr}"), Auth::ApiKey(key.key.clone())).unwrap();

    let id = |v: serde_json::Value| v["id"].as_i64().unwrap();
    let rocky = id(client
        .create("distros", &json!({"slug": "rocky9"}))
        .await
        .unwrap());
    let compute = id(client
        .create("images", &json!({"slug": "compute", "distro": rocky}))
        .await
        .unwrap());
    let login = id(client
        .create("images", &json!({"slug": "login"}))
        .await
        .unwrap());
    let gpu = id(client
        .create("groups", &json!({"slug": "gpu"}))
        .await
        .unwrap());
    let rack4 = id(client
        .create("groups", &json!({"slug": "rack4"}))
        .await
        .unwrap());
    for (host, image, groups) in [
        ("c01", Some(compute), vec![gpu, rack4]),
        ("c02", Some(compute), vec![rack4]),
        ("login1", Some(login), vec![]),
        ("spare", None, vec![rack4]),
    ] {
        client
            .create(
                "systems",
                &json!({"hostname": host, "image": image, "groups": groups}),
            )
            .await
            .unwrap();
    }

    // The job server's follower, fed by the boot config it follows.
    let stop = CancellationToken::new();
    let (tx, snapshot) = watch::channel(Arc::new(BootConfig {
        revision: -1,
        ..Default::default()
    }));
    let follower = tokio::spawn(mprov_boot::snapshot::follow(
        client.clone(),
        tx,
        stop.clone(),
    ));
    let file = dir.path().join("etc/genders");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let (_keep, clients) = watch::channel(client.clone());
    let genders = tokio::spawn(mprov_boot::modules::libgenders::follow(
        clients,
        snapshot,
        file.clone(),
        stop.clone(),
    ));

    until_listed(&file, &["-n", "image=compute"], &["c01", "c02"]).await;
    assert_eq!(nodeattr(&file, &["-n", "gpu"]), ["c01"]);
    assert_eq!(nodeattr(&file, &["-n", "rack4"]), ["c01", "c02", "spare"]);
    assert_eq!(nodeattr(&file, &["-n", "os=rocky9"]), ["c01", "c02"]);
    assert_eq!(nodeattr(&file, &["-n", "image=login"]), ["login1"]);
    assert_eq!(
        nodeattr(&file, &["-n", "all"]),
        ["c01", "c02", "login1", "spare"]
    );
    assert_eq!(nodeattr(&file, &["-n", "rack4&&~gpu"]), ["c02", "spare"]);
    // Its syntax, as nodeattr checks it.
    nodeattr(&file, &["-k"]);

    // The inventory changes: the file follows.
    client
        .update("systems", "c02", &json!({"image": login, "groups": [gpu]}))
        .await
        .unwrap();
    until_listed(&file, &["-n", "image=compute"], &["c01"]).await;
    assert_eq!(nodeattr(&file, &["-n", "gpu"]), ["c01", "c02"]);
    assert_eq!(nodeattr(&file, &["-n", "image=login"],), ["c02", "login1"]);
    client.delete("systems", "spare").await.unwrap();
    until_listed(&file, &["-n", "rack4"], &["c01"]).await;
    let names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["genders"], "no temporary file left");

    stop.cancel();
    follower.await.unwrap();
    genders.await.unwrap();
    stop_control.cancel();
    task.await.unwrap();
}
