//! LDAP sign-in (`mprov_control::ldap::authenticate`) against a real slapd
//! (`mprov_tests::ldap::Slapd`): roles from the three kinds of group, the
//! refusals, filter and DN injection, StartTLS with the right and a wrong
//! CA, and a server that is not there.

use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use anyhow::Result;
use mprov_control::config::{
    DEFAULT_LDAP_USER_FILTER, LdapConfig, LdapServiceAccount, LdapUserLookup, SecretString,
};
use mprov_control::ldap::{LdapError, LdapRole, LdapUser, authenticate};
use mprov_tests::ldap::{Slapd, TestPki};

const PEOPLE: &str = "ou=people,dc=example,dc=org";
const ADMINS: &str = "cn=admins,ou=groups,dc=example,dc=org";
const READERS: &str = "cn=readers,ou=groups,dc=example,dc=org";
const OPERATORS: &str = "cn=operators,ou=groups,dc=example,dc=org";
const SERVICE_DN: &str = "cn=svc,dc=example,dc=org";
const SERVICE_PASSWORD: &str = "svc-secret-4711";

/// The directory: alice an admin (a `groupOfNames` member, her DN written
/// in another case and spacing than her entry's), bob read-only (a
/// `groupOfUniqueNames` member), carol in no group, dave in the
/// `posixGroup` operators by `memberUid`, two entries sharing the cn
/// `Twin`, Erin spelled with a capital, a service account.
const DATA: &str = "\
dn: ou=people,dc=example,dc=org
objectClass: organizationalUnit
ou: people

dn: ou=groups,dc=example,dc=org
objectClass: organizationalUnit
ou: groups

dn: cn=svc,dc=example,dc=org
objectClass: organizationalRole
objectClass: simpleSecurityObject
cn: svc
userPassword: svc-secret-4711

dn: uid=alice,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: alice
cn: Alice
sn: A
userPassword: alice-pw

dn: uid=bob,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: bob
cn: Bob
sn: B
userPassword: bob-pw

dn: uid=carol,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: carol
cn: Carol
sn: C
userPassword: carol-pw

dn: uid=dave,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: dave
cn: Dave
sn: D
userPassword: dave-pw

dn: uid=Erin,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: Erin
cn: Erin
sn: E
userPassword: erin-pw

dn: uid=twin1,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: twin1
cn: Twin
sn: T
userPassword: twin-pw

dn: uid=twin2,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
uid: twin2
cn: Twin
sn: T
userPassword: twin-pw

dn: cn=admins,ou=groups,dc=example,dc=org
objectClass: groupOfNames
cn: admins
member: UID=Alice, OU=People, DC=example, DC=org

dn: cn=readers,ou=groups,dc=example,dc=org
objectClass: groupOfUniqueNames
cn: readers
uniqueMember: uid=bob,ou=people,dc=example,dc=org
uniqueMember: uid=Erin,ou=people,dc=example,dc=org

dn: cn=operators,ou=groups,dc=example,dc=org
objectClass: posixGroup
cn: operators
gidNumber: 5000
memberUid: dave
";

fn start() -> Result<Slapd> {
    Slapd::start(DATA)
}

/// Search mode with the service account; admins and readers.
fn search_config(slapd: &Slapd) -> LdapConfig {
    LdapConfig {
        uri: slapd.uri(),
        start_tls: false,
        ca_file: None,
        service: Some(LdapServiceAccount {
            dn: SERVICE_DN.into(),
            password: SecretString::new(SERVICE_PASSWORD),
        }),
        lookup: LdapUserLookup::Search {
            base: PEOPLE.into(),
            filter: DEFAULT_LDAP_USER_FILTER.into(),
        },
        admin_group: Some(ADMINS.into()),
        readonly_group: Some(READERS.into()),
        timeout: Duration::from_secs(5),
    }
}

fn template_config(slapd: &Slapd) -> LdapConfig {
    LdapConfig {
        service: None,
        lookup: LdapUserLookup::DnTemplate(format!("uid=%(user)s,{PEOPLE}")),
        ..search_config(slapd)
    }
}

fn user(name: &str, dn_uid: &str, role: LdapRole) -> LdapUser {
    LdapUser {
        name: name.into(),
        dn: format!("uid={dn_uid},{PEOPLE}"),
        role,
    }
}

#[tokio::test]
async fn roles_come_from_the_groups() -> Result<()> {
    let slapd = start()?;
    let cfg = search_config(&slapd);
    assert_eq!(
        authenticate(&cfg, "alice", "alice-pw").await?,
        user("alice", "alice", LdapRole::Admin)
    );
    // The name as the directory spells it, whatever the case typed.
    assert_eq!(
        authenticate(&cfg, "ALICE", "alice-pw").await?,
        user("alice", "alice", LdapRole::Admin)
    );
    assert_eq!(
        authenticate(&cfg, "bob", "bob-pw").await?,
        user("bob", "bob", LdapRole::ReadOnly)
    );
    assert_eq!(
        authenticate(&cfg, "erin", "erin-pw").await?,
        user("Erin", "Erin", LdapRole::ReadOnly)
    );
    // A posixGroup names its members by uid.
    let operators = LdapConfig {
        admin_group: Some(OPERATORS.into()),
        ..cfg.clone()
    };
    assert_eq!(
        authenticate(&operators, "dave", "dave-pw").await?,
        user("dave", "dave", LdapRole::Admin)
    );
    // Only a read-only group: alice is not in it.
    let readonly_only = LdapConfig {
        admin_group: None,
        ..cfg.clone()
    };
    assert!(matches!(
        authenticate(&readonly_only, "alice", "alice-pw").await,
        Err(LdapError::NotInGroup { .. })
    ));
    slapd.stop()
}

#[tokio::test]
async fn a_user_in_no_group_is_refused_naming_the_groups() -> Result<()> {
    let slapd = start()?;
    let cfg = search_config(&slapd);
    let err = authenticate(&cfg, "carol", "carol-pw").await.unwrap_err();
    let LdapError::NotInGroup { user, groups } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(user, &format!("uid=carol,{PEOPLE}"));
    assert_eq!(
        groups,
        &[
            format!("LDAP_ADMIN_GROUP {ADMINS}"),
            format!("LDAP_READONLY_GROUP {READERS}")
        ]
    );
    // A wrong password is found out before the groups.
    assert!(matches!(
        authenticate(&cfg, "carol", "nope").await,
        Err(LdapError::BadCredentials)
    ));
    slapd.stop()
}

#[tokio::test]
async fn wrong_password_and_unknown_user_are_one_error() -> Result<()> {
    let slapd = start()?;
    for cfg in [search_config(&slapd), template_config(&slapd)] {
        for (name, password) in [
            ("alice", "wrong"),
            ("alice", "alice-pw "),
            ("nobody", "alice-pw"),
            ("nobody", "wrong"),
        ] {
            let err = authenticate(&cfg, name, password).await.unwrap_err();
            assert!(
                matches!(err, LdapError::BadCredentials),
                "{name} {password:?} with {:?}: {err:?}",
                cfg.lookup
            );
            assert_eq!(err.to_string(), "wrong user name or password");
        }
    }
    // A name that two entries match is refused the same way.
    let by_cn = LdapConfig {
        lookup: LdapUserLookup::Search {
            base: PEOPLE.into(),
            filter: "(cn=%(user)s)".into(),
        },
        ..search_config(&slapd)
    };
    assert!(matches!(
        authenticate(&by_cn, "Twin", "twin-pw").await,
        Err(LdapError::BadCredentials)
    ));
    slapd.stop()
}

#[tokio::test]
async fn an_empty_password_is_refused_before_any_bind() -> Result<()> {
    let slapd = start()?;
    // This server takes an unauthenticated bind (a DN, no password) as a
    // success: a client that let an empty password through would sign
    // anyone in.
    let (conn, mut ldap) = ldap3::LdapConnAsync::new(&slapd.uri()).await?;
    ldap3::drive!(conn);
    let alice = format!("uid=alice,{PEOPLE}");
    assert_eq!(ldap.simple_bind(&alice, "").await?.rc, 0);
    ldap.unbind().await?;

    for cfg in [search_config(&slapd), template_config(&slapd)] {
        assert!(matches!(
            authenticate(&cfg, "alice", "").await,
            Err(LdapError::EmptyPassword)
        ));
    }
    // Refused before connecting: the same answer with no server at all.
    let mut gone = template_config(&slapd);
    gone.uri = format!("ldap://127.0.0.1:{}", closed_port()?);
    assert!(matches!(
        authenticate(&gone, "alice", "").await,
        Err(LdapError::EmptyPassword)
    ));
    for name in ["", " ", "a\0b", &"x".repeat(300)] {
        assert!(matches!(
            authenticate(&gone, name, "pw").await,
            Err(LdapError::InvalidUserName(_))
        ));
    }
    slapd.stop()
}

#[tokio::test]
async fn filter_injection_finds_nobody() -> Result<()> {
    let slapd = start()?;
    // With the names put in unescaped, `al*` alone would match exactly
    // alice, and each other name an entry set that includes her.
    let cfg = LdapConfig {
        lookup: LdapUserLookup::Search {
            base: PEOPLE.into(),
            filter: "(&(objectClass=inetOrgPerson)(uid=%(user)s))".into(),
        },
        ..search_config(&slapd)
    };
    for name in [
        "al*",
        "*",
        "*)(uid=*",
        "admin)(|(uid=*",
        "alice)(|(uid=alice",
        "alice)(uid=alice",
        "\\2a",
    ] {
        let err = authenticate(&cfg, name, "alice-pw").await.unwrap_err();
        assert!(matches!(err, LdapError::BadCredentials), "{name}: {err:?}");
    }
    // The same names through a DN template find no entry either.
    let template = template_config(&slapd);
    for name in ["*", "alice,ou=people", "alice)(uid=*", "uid=alice"] {
        let err = authenticate(&template, name, "alice-pw").await.unwrap_err();
        assert!(matches!(err, LdapError::BadCredentials), "{name}: {err:?}");
    }
    // The proof that the configuration would find alice.
    assert_eq!(
        authenticate(&cfg, "alice", "alice-pw").await?.role,
        LdapRole::Admin
    );
    slapd.stop()
}

#[tokio::test]
async fn a_dn_template_binds_without_a_service_account() -> Result<()> {
    let slapd = start()?;
    let cfg = template_config(&slapd);
    assert!(cfg.service.is_none());
    assert_eq!(
        authenticate(&cfg, "alice", "alice-pw").await?,
        user("alice", "alice", LdapRole::Admin)
    );
    assert_eq!(
        authenticate(&cfg, "bob", "bob-pw").await?,
        user("bob", "bob", LdapRole::ReadOnly)
    );
    // Anonymous search (no service account) works too on this server.
    let anonymous = LdapConfig {
        service: None,
        ..search_config(&slapd)
    };
    assert_eq!(
        authenticate(&anonymous, "bob", "bob-pw").await?.role,
        LdapRole::ReadOnly
    );
    slapd.stop()
}

#[tokio::test]
async fn misconfigurations_name_the_variable_and_never_the_password() -> Result<()> {
    let slapd = start()?;
    let mut cfg = search_config(&slapd);
    cfg.service = Some(LdapServiceAccount {
        dn: SERVICE_DN.into(),
        password: SecretString::new("not-the-svc-password"),
    });
    let err = authenticate(&cfg, "alice", "alice-pw").await.unwrap_err();
    assert!(
        matches!(
            err,
            LdapError::Misconfigured {
                var: "LDAP_BIND_PASSWORD",
                ..
            }
        ),
        "{err:?}"
    );
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("not-the-svc-password"), "{shown}");
    assert!(!shown.contains("alice-pw"), "{shown}");

    let cfg = LdapConfig {
        admin_group: Some("cn=missing,ou=groups,dc=example,dc=org".into()),
        ..search_config(&slapd)
    };
    let err = authenticate(&cfg, "alice", "alice-pw").await.unwrap_err();
    assert!(
        matches!(
            err,
            LdapError::Misconfigured {
                var: "LDAP_ADMIN_GROUP",
                ..
            }
        ),
        "{err:?}"
    );
    let cfg = LdapConfig {
        lookup: LdapUserLookup::Search {
            base: "ou=nowhere,dc=example,dc=org".into(),
            filter: DEFAULT_LDAP_USER_FILTER.into(),
        },
        ..search_config(&slapd)
    };
    let err = authenticate(&cfg, "alice", "alice-pw").await.unwrap_err();
    assert!(
        matches!(
            err,
            LdapError::Misconfigured {
                var: "LDAP_USER_SEARCH_BASE",
                ..
            }
        ),
        "{err:?}"
    );
    slapd.stop()
}

#[tokio::test]
async fn start_tls_checks_the_servers_certificate() -> Result<()> {
    let slapd = start()?;
    let right = LdapConfig {
        start_tls: true,
        ca_file: Some(slapd.ca_file().to_path_buf()),
        ..search_config(&slapd)
    };
    assert_eq!(
        authenticate(&right, "alice", "alice-pw").await?,
        user("alice", "alice", LdapRole::Admin)
    );

    // Another CA: the handshake fails, nothing is sent.
    let dir = tempfile::tempdir()?;
    let other_ca = dir.path().join("other-ca.pem");
    std::fs::write(&other_ca, TestPki::new()?.ca_pem)?;
    let wrong = LdapConfig {
        ca_file: Some(other_ca),
        ..right.clone()
    };
    let err = authenticate(&wrong, "alice", "alice-pw").await.unwrap_err();
    let LdapError::Tls { uri, reason } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(uri, &slapd.uri());
    assert!(reason.to_lowercase().contains("certificate"), "{reason}");

    // The system's roots do not know the test CA either.
    let system = LdapConfig {
        ca_file: None,
        ..right.clone()
    };
    assert!(matches!(
        authenticate(&system, "alice", "alice-pw").await,
        Err(LdapError::Tls { .. })
    ));
    slapd.stop()
}

#[tokio::test]
async fn an_unreachable_server_fails_fast_and_says_where() -> Result<()> {
    let slapd = start()?;
    let base = search_config(&slapd);
    slapd.stop()?;

    // Nothing listens: refused at once.
    let uri = format!("ldap://127.0.0.1:{}", closed_port()?);
    let refused = LdapConfig {
        uri: uri.clone(),
        ..base.clone()
    };
    let started = Instant::now();
    let err = authenticate(&refused, "alice", "alice-pw")
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(&err, LdapError::Unreachable { uri: u, .. } if *u == uri),
        "{err:?}"
    );
    assert!(err.to_string().contains(&uri), "{err}");

    // A peer that accepts and never answers: bounded by the timeout.
    let silent = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let uri = format!("ldap://127.0.0.1:{}", silent.local_addr()?.port());
    let mute = LdapConfig {
        uri: uri.clone(),
        timeout: Duration::from_secs(1),
        ..base.clone()
    };
    let started = Instant::now();
    let err = authenticate(&mute, "alice", "alice-pw").await.unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    assert!(
        matches!(&err, LdapError::Timeout { uri: u, .. } if *u == uri),
        "{err:?}"
    );
    // With StartTLS, the silence comes before the handshake.
    let mute_tls = LdapConfig {
        start_tls: true,
        ..mute
    };
    let started = Instant::now();
    let err = authenticate(&mute_tls, "alice", "alice-pw")
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(4));
    assert!(matches!(err, LdapError::Timeout { .. }), "{err:?}");
    drop(silent);
    Ok(())
}

/// A loopback port nothing listens on (bound, then closed).
fn closed_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}
