//! Renders iPXE scripts (boot, discovery, local boot, retry loops). Which iPXE
//! binary each firmware is sent is not decided here but by the DHCP server
//! (`mprov-dhcp`'s boot-file choice), before iPXE runs at all.
//!
//! Architecture invariant: this is a pure library. No async runtime, no sockets.
//! Every function turns its inputs into the script's text; the control
//! service's `/ipxe/` endpoint decides which one a node gets.
//!
//! Values that come from the inventory (host names, URLs, kernel arguments)
//! are checked by [`safe_word`] before they enter a script: iPXE expands
//! `${...}`, splits a line on spaces, ends it at a word starting with `#`,
//! joins it to the next when it ends in `\`, and runs the words after a `;`,
//! `&&` or `||` word as a command of their own (`core/exec.c`,
//! `image/script.c`), so a stray character could change what a node boots.
//! The text of a message ([`retry_script`]) is made harmless the same way.

#![warn(missing_docs)]

use std::fmt::Write as _;

/// Where a node can fetch its kernel and agent initramfs: one job server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source<'a> {
    /// The kernel's URL.
    pub kernel_url: &'a str,
    /// The agent initramfs' URL.
    pub initrd_url: &'a str,
}

/// What a node that should boot from the network gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot<'a> {
    /// The node's host name (shown on its console).
    pub hostname: &'a str,
    /// Kernel and initramfs, best job server first; the script falls back
    /// to the next when a download fails.
    pub sources: &'a [Source<'a>],
    /// Kernel arguments, each one word (`key=value` or a flag).
    pub args: &'a [String],
    /// Where to chain when every source failed (see [`retry_script`]).
    pub chain_url: &'a str,
    /// How long to wait before that.
    pub retry_secs: u32,
    /// Append [`LEASE_ARG`]: the agent takes iPXE's lease and sends no DHCP.
    pub carry_lease: bool,
}

/// The kernel argument that carries the lease iPXE holds on to the agent,
/// which then configures its interface from it and sends no DHCP of its
/// own: `mprov_lease=<address>,<netmask>,<gateway>,<dns>,<dhcp-server>,<mtu>,<domain>`,
/// each from `net0`'s settings (the interface the chain URL names the node
/// by, `${net0/mac}`), expanded by iPXE when it runs the `kernel` line. A
/// setting iPXE does not have expands to nothing; the agent falls back to
/// DHCP when the address or netmask is missing or the values do not make a
/// usable lease.
pub const LEASE_ARG: &str = "mprov_lease=${net0/ip},${net0/netmask},${net0/gateway},${net0/dns},${net0/dhcp-server},${net0/mtu},${net0/domain}";

/// A value that cannot go into a script.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} {value:?} cannot go into an iPXE script (spaces, quotes, `$`, `#`, `\\`, the command separators `;`, `&`, `|` and control characters are not allowed)"
)]
pub struct UnsafeValue {
    /// Which value.
    pub what: &'static str,
    /// The value.
    pub value: String,
}

/// The printable characters iPXE may read as more than themselves: `$`
/// (expansion), quotes, `\` (a line's continuation), `#` (a comment), and
/// the characters of the command separators `;`, `&&` and `||`. iPXE splits
/// only on whole separator words, but a lone `&` or `|` has no place in a
/// kernel argument or an address either, so the characters are refused.
const SPECIAL: &[u8] = b"$\"'\\#;&|";

/// Whether `s` is one iPXE word that expands to itself and stays inside the
/// command it is in: printable ASCII, none of the special characters above.
pub fn safe_word(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !SPECIAL.contains(&b))
}

fn check<'a>(what: &'static str, value: &'a str) -> Result<&'a str, UnsafeValue> {
    if safe_word(value) {
        Ok(value)
    } else {
        Err(UnsafeValue {
            what,
            value: value.to_owned(),
        })
    }
}

/// The script that boots a node's kernel and the agent initramfs, from the
/// first source that serves both; when none does, it says so and chains to
/// the boot script URL again after `retry_secs`.
///
/// `initrd=` names the initramfs on the kernel command line: the EFI stub
/// loads it by that name from iPXE's file system (BIOS ignores it).
pub fn boot_script(boot: &Boot<'_>) -> Result<String, UnsafeValue> {
    let hostname = check("host name", boot.hostname)?;
    let chain = check_chain(boot.chain_url)?;
    let mut args = String::new();
    for arg in boot.args {
        args.push(' ');
        args.push_str(check("kernel argument", arg)?);
    }
    if boot.carry_lease {
        args.push(' ');
        args.push_str(LEASE_ARG);
    }
    let mut s = String::from("#!ipxe\n");
    let _ = writeln!(s, "echo mProv: booting {hostname}");
    for (i, src) in boot.sources.iter().enumerate() {
        let kernel = check("kernel URL", src.kernel_url)?;
        let initrd = check("initramfs URL", src.initrd_url)?;
        let initrd_name = initrd.rsplit('/').next().unwrap_or(initrd);
        let next = if i + 1 == boot.sources.len() {
            "failed".to_owned()
        } else {
            format!("source{}", i + 1)
        };
        let _ = writeln!(s, ":source{i}");
        let _ = writeln!(s, "imgfree");
        let _ = writeln!(
            s,
            "kernel {kernel} initrd={initrd_name}{args} || goto {next}"
        );
        let _ = writeln!(s, "initrd {initrd} || goto {next}");
        let _ = writeln!(s, "boot || goto {next}");
    }
    let _ = writeln!(s, ":failed");
    let _ = writeln!(
        s,
        "echo mProv: no job server served the kernel and initramfs; retrying"
    );
    let _ = writeln!(s, "sleep {}", boot.retry_secs);
    let _ = writeln!(s, "chain {chain}");
    Ok(s)
}

/// The iPXE settings a chain URL may expand: the MAC that booted and the
/// firmware platform and architecture. Nothing else from iPXE's settings may
/// reach the control service.
pub const CHAIN_EXPANSIONS: [&str; 3] = ["${net0/mac}", "${platform}", "${buildarch}"];

/// Whether `url` can be a script's chain URL (see [`discovery_script`]):
/// a service checks its own once, at start, so every script it renders can
/// chain.
pub fn safe_chain_url(url: &str) -> bool {
    check_chain(url).is_ok()
}

/// Checks a chain URL: one word whose only `${...}` are [`CHAIN_EXPANSIONS`]
/// and whose only `&` are single ones between query parameters (the chain
/// query of `mprov_api::boot` has them; iPXE splits on `&&` alone).
fn check_chain(url: &str) -> Result<&str, UnsafeValue> {
    let mut rest = url.to_owned();
    for e in CHAIN_EXPANSIONS {
        rest = rest.replace(e, "x");
    }
    let query_ands = match rest.split_once('?') {
        Some((_, query)) => !query.contains("&&") && !query.ends_with('&'),
        None => !rest.contains('&'),
    };
    if query_ands && safe_word(&rest.replace('&', "x")) {
        Ok(url)
    } else {
        Err(UnsafeValue {
            what: "chain URL",
            value: url.to_owned(),
        })
    }
}

/// The script for a node the inventory does not know: it says so on the
/// console and chains to `chain_url` (the boot config's script URL, with its
/// `${net0/mac}`) after `retry_secs`, so adding the node to the inventory is
/// enough for it to boot.
pub fn discovery_script(chain_url: &str, retry_secs: u32) -> Result<String, UnsafeValue> {
    let url = check_chain(chain_url)?;
    Ok(format!(
        "#!ipxe\necho mProv: this node (${{net0/mac}}) is not in the inventory; add it, it boots on the next try\nsleep {retry_secs}\nchain {url}\n"
    ))
}

/// The script for a node set not to boot from the network: boot the next
/// device in the firmware's order.
pub fn local_boot_script() -> String {
    "#!ipxe\necho mProv: booting from the local disk\nexit\n".to_owned()
}

/// The script that waits for something (an image not yet on any job
/// server, a lease not yet reported) and chains to `chain_url` again.
pub fn retry_script(
    message: &str,
    chain_url: &str,
    retry_secs: u32,
) -> Result<String, UnsafeValue> {
    let url = check_chain(chain_url)?;
    // The message is echoed: its words stay words of the `echo` command
    // (a `;` word would start a command of its own, a `#` word end the line,
    // a trailing `\` swallow the `sleep`). Quotes stay: iPXE prints them.
    let message: String = message
        .chars()
        .map(|c| match c {
            ';' => ',',
            ' ' => ' ',
            c if c.is_ascii_graphic() && !"$\\#&|".contains(c) => c,
            _ => '?',
        })
        .collect();
    Ok(format!(
        "#!ipxe\necho mProv: {message}\nsleep {retry_secs}\nchain {url}\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAIN: &str = "http://c/ipxe/?mac=${net0/mac}";

    #[test]
    fn a_boot_script_loads_kernel_and_initramfs_with_the_arguments() {
        let args = vec![
            "console=ttyS0".to_owned(),
            "mprov_enroll=n0nce".to_owned(),
            "mprov_ca=ab12".to_owned(),
        ];
        let sources = [
            Source {
                kernel_url: "http://10.0.0.2:8081/images/compute/3/vmlinuz",
                initrd_url: "http://10.0.0.2:8081/images/compute/3/initramfs.img",
            },
            Source {
                kernel_url: "http://10.0.0.3:8081/images/compute/3/vmlinuz",
                initrd_url: "http://10.0.0.3:8081/images/compute/3/initramfs.img",
            },
        ];
        let s = boot_script(&Boot {
            hostname: "c01",
            sources: &sources,
            args: &args,
            chain_url: CHAIN,
            retry_secs: 10,
            carry_lease: true,
        })
        .unwrap();
        let lease = " mprov_lease=${net0/ip},${net0/netmask},${net0/gateway},${net0/dns},${net0/dhcp-server},${net0/mtu},${net0/domain}";
        assert_eq!(
            s,
            format!(
                "#!ipxe\necho mProv: booting c01\n\
             :source0\nimgfree\n\
             kernel http://10.0.0.2:8081/images/compute/3/vmlinuz initrd=initramfs.img console=ttyS0 mprov_enroll=n0nce mprov_ca=ab12{lease} || goto source1\n\
             initrd http://10.0.0.2:8081/images/compute/3/initramfs.img || goto source1\n\
             boot || goto source1\n\
             :source1\nimgfree\n\
             kernel http://10.0.0.3:8081/images/compute/3/vmlinuz initrd=initramfs.img console=ttyS0 mprov_enroll=n0nce mprov_ca=ab12{lease} || goto failed\n\
             initrd http://10.0.0.3:8081/images/compute/3/initramfs.img || goto failed\n\
             boot || goto failed\n\
             :failed\necho mProv: no job server served the kernel and initramfs; retrying\n\
             sleep 10\nchain http://c/ipxe/?mac=${{net0/mac}}\n"
            )
        );
    }

    #[test]
    fn values_that_could_change_the_script_are_refused() {
        for bad in [
            "a b",
            "x${net0/mac}",
            "q\"",
            "a\nb",
            "",
            "#c",
            "é",
            ";",
            "&&",
            "||",
            "console=ttyS0;chain",
            "a&b",
            "a|b",
            "x\\",
        ] {
            let args = vec![bad.to_owned()];
            let err = boot_script(&Boot {
                hostname: "c01",
                sources: &[Source {
                    kernel_url: "http://h/k",
                    initrd_url: "http://h/i",
                }],
                args: &args,
                chain_url: CHAIN,
                retry_secs: 1,
                carry_lease: false,
            })
            .unwrap_err();
            assert_eq!(err.what, "kernel argument", "{bad:?}");
        }
        assert!(discovery_script("http://h/ipxe/?mac=${net0/mac}", 10).is_ok());
        for bad in [
            "http://h/ipxe/?mac=${net0/ip}",
            "http://h/ipxe/?mac=${net0/mac",
            "http://h/ipxe/ x",
            "",
        ] {
            let err = discovery_script(bad, 10).unwrap_err();
            assert_eq!(err.what, "chain URL", "{bad:?}");
            assert!(retry_script("m", bad, 10).is_err(), "{bad:?}");
        }
        assert!(safe_word("http://h/ipxe/?mac=aa:bb"));
        // The chain URL's own query separators pass; a doubled one does not.
        let chain = "http://h/ipxe/?mac=${net0/mac}&platform=${platform}";
        assert!(discovery_script(chain, 10).is_ok());
        for bad in [
            "http://h/ipxe/?mac=${net0/mac}&&reboot",
            "http://h/ip&xe/",
            "http://h/ipxe/?mac=${net0/mac}&",
            "http://h/ipxe/?mac=${net0/mac};",
            "http://h/ipxe/?mac=${net0/mac}||x",
        ] {
            assert!(discovery_script(bad, 10).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_message_cannot_add_a_command() {
        let r = retry_script(
            "kernel argument ; chain http://x/ && reboot || exit # c \\",
            CHAIN,
            10,
        )
        .unwrap();
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(lines.len(), 4, "{r}");
        assert_eq!(
            lines[1],
            "echo mProv: kernel argument , chain http://x/ ?? reboot ?? exit ? c ?"
        );
        for word in lines[1].split_whitespace() {
            assert!(!matches!(word, ";" | "&&" | "||") && !word.starts_with('#'));
        }
        assert!(!lines[1].ends_with('\\'));
        assert_eq!(lines[2], "sleep 10");
    }

    #[test]
    fn discovery_local_and_retry() {
        let chain = "http://h:8080/ipxe/?mac=${net0/mac}&platform=${platform}";
        let d = discovery_script(chain, 15).unwrap();
        assert!(
            d.starts_with("#!ipxe\n")
                && d.contains(
                    "sleep 15\nchain http://h:8080/ipxe/?mac=${net0/mac}&platform=${platform}\n"
                ),
            "{d}"
        );
        assert_eq!(
            local_boot_script(),
            "#!ipxe\necho mProv: booting from the local disk\nexit\n"
        );
        let r = retry_script("image x: no job server ${yet}", chain, 30).unwrap();
        assert!(
            r.contains("echo mProv: image x: no job server ?{yet}\n"),
            "{r}"
        );
    }
}
