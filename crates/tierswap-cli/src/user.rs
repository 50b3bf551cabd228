//! `run --user USER[:GROUP]`: the program runs as USER, keeping CAP_SYS_PTRACE.
//!
//! The pager follows a process's forks through userfaultfd's fork events, and the kernel
//! grants those (UFFD_FEATURE_EVENT_FORK, in UFFDIO_API) only to a process with
//! CAP_SYS_PTRACE. So a service that runs as a user of its own (PostgreSQL refuses to run as
//! root) can be managed only when it holds that capability. `run --user`, started as root,
//! switches this process to the user before it execs the program — single-threaded, with
//! no shim loaded — and keeps CAP_SYS_PTRACE as an *ambient* capability, which the kernel
//! hands to the exec'd program and to every program it execs in turn (but for setuid
//! programs and programs with file capabilities); every other capability is dropped. It is
//! what `setpriv --reuid U --regid G --init-groups --inh-caps +sys_ptrace --ambient-caps
//! +sys_ptrace` does, or systemd's `User=` with `AmbientCapabilities=CAP_SYS_PTRACE`.
//! HOME, USER and LOGNAME become the user's, as su and runuser set them.

use std::ffi::CString;

use caps::{CapSet, Capability, CapsHashSet};
use nix::unistd::{Gid, Group, Uid, User};

/// Whom the program runs as.
#[derive(Debug)]
pub struct Target {
    /// The user.
    pub uid: Uid,
    /// The group: GROUP, else the user's primary group.
    pub gid: Gid,
    /// The user's name and home, when the user database has them.
    entry: Option<(String, std::path::PathBuf)>,
}

/// Reads `USER[:GROUP]` (names or numbers); the user must exist unless given by number.
pub fn parse(spec: &str) -> Result<Target, String> {
    let bad = |what: &str| format!("--user '{spec}': {what}");
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u.trim(), Some(g.trim())),
        None => (spec.trim(), None),
    };
    if user.is_empty() {
        return Err(bad("give a user name or uid, e.g. --user postgres or --user 101:104"));
    }
    let found = match user.parse::<u32>() {
        Ok(n) => User::from_uid(Uid::from_raw(n)).map_err(|e| bad(&e.to_string()))?,
        Err(_) => Some(
            User::from_name(user)
                .map_err(|e| bad(&e.to_string()))?
                .ok_or_else(|| bad("no such user (see getent passwd)"))?,
        ),
    };
    let uid = match &found {
        Some(u) => u.uid,
        None => Uid::from_raw(user.parse().expect("numeric: checked above")),
    };
    let gid = match group {
        Some("") => return Err(bad("the group after ':' is empty")),
        Some(g) => match g.parse::<u32>() {
            Ok(n) => Gid::from_raw(n),
            Err(_) => {
                Group::from_name(g)
                    .map_err(|e| bad(&e.to_string()))?
                    .ok_or_else(|| bad(&format!("no such group '{g}' (see getent group)")))?
                    .gid
            }
        },
        None => match &found {
            Some(u) => u.gid,
            None => return Err(bad("a uid with no entry in the user database needs a group: give UID:GID")),
        },
    };
    Ok(Target { uid, gid, entry: found.map(|u| (u.name, u.dir)) })
}

/// The environment the program gets beside the switch: the user's HOME, USER and LOGNAME.
pub fn environment(t: &Target) -> Vec<(&'static str, std::ffi::OsString)> {
    match &t.entry {
        Some((name, home)) => {
            vec![("HOME", home.clone().into()), ("USER", name.into()), ("LOGNAME", name.into())]
        }
        None => Vec::new(),
    }
}

/// Switches this process to the target, with CAP_SYS_PTRACE its only capability (permitted,
/// effective, inheritable and ambient). Needs root; called right before the exec.
pub fn switch(t: &Target) -> Result<(), String> {
    if !Uid::effective().is_root() {
        return Err("--user: run must be started as root to switch to another user".into());
    }
    let step = |what: &str, e: &dyn std::fmt::Display| format!("--user: cannot {what}: {e}");
    // Keep the permitted set across the uid change; the effective set is cleared by it.
    caps::securebits::set_keepcaps(true).map_err(|e| step("keep capabilities across the switch", &e))?;
    match &t.entry {
        Some((name, _)) => {
            let name = CString::new(name.as_str()).map_err(|e| step("name the user", &e))?;
            nix::unistd::initgroups(&name, t.gid).map_err(|e| step("set the user's groups", &e))?
        }
        None => nix::unistd::setgroups(&[t.gid]).map_err(|e| step("set the groups", &e))?,
    }
    nix::unistd::setresgid(t.gid, t.gid, t.gid).map_err(|e| step("switch group", &e))?;
    nix::unistd::setresuid(t.uid, t.uid, t.uid).map_err(|e| step("switch user", &e))?;
    let ptrace: CapsHashSet = [Capability::CAP_SYS_PTRACE].into_iter().collect();
    for set in [CapSet::Effective, CapSet::Inheritable, CapSet::Permitted] {
        caps::set(None, set, &ptrace).map_err(|e| step("keep CAP_SYS_PTRACE", &e))?;
    }
    caps::raise(None, CapSet::Ambient, Capability::CAP_SYS_PTRACE)
        .map_err(|e| step("make CAP_SYS_PTRACE ambient", &e))?;
    caps::securebits::set_keepcaps(false).map_err(|e| step("clear keep-capabilities", &e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_groups_are_read_by_name_or_number() {
        let root = parse("root").unwrap();
        assert_eq!((root.uid.as_raw(), root.gid.as_raw()), (0, 0));
        assert_eq!(environment(&root).iter().find(|(k, _)| *k == "USER").map(|(_, v)| v.clone()), Some("root".into()));
        let t = parse("0:65534").unwrap();
        assert_eq!((t.uid.as_raw(), t.gid.as_raw()), (0, 65534));
        let t = parse("root:root").unwrap();
        assert_eq!(t.gid.as_raw(), 0);
        // A uid with no entry needs its group; one with a group is taken as given.
        let free = (60000..65000).find(|n| User::from_uid(Uid::from_raw(*n)).ok().flatten().is_none()).unwrap();
        assert!(parse(&free.to_string()).unwrap_err().contains("needs a group"));
        let t = parse(&format!("{free}:{free}")).unwrap();
        assert_eq!((t.uid.as_raw(), t.gid.as_raw()), (free, free));
        assert!(environment(&t).is_empty());
        for (spec, says) in [
            ("no-such-user-here", "no such user"),
            ("root:no-such-group-here", "no such group"),
            ("", "give a user"),
            ("root:", "is empty"),
        ] {
            let e = parse(spec).unwrap_err();
            assert!(e.contains(says) && e.contains("--user"), "{spec}: {e}");
        }
    }
}
