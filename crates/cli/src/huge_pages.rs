//! Transparent huge pages for what the plugin allocates. On the CPU plugin a decoding step
//! streams every weight and cache from memory; in 2 MiB pages rather than 4 KiB ones it takes
//! far fewer TLB misses (`siphon generate` ~2.6% faster, docs/BENCHMARKS.md). The plugin
//! allocates through glibc's `malloc`, which asks the kernel for huge pages
//! (`madvise(MADV_HUGEPAGE)`, what the kernel's usual `madvise` mode waits for) only when
//! `GLIBC_TUNABLES` holds `glibc.malloc.hugetlb=1` as the process starts. So the process
//! re-executes itself once, first thing, with the tunable added — unless `GLIBC_TUNABLES`
//! names it already, which is also how to turn it off (`glibc.malloc.hugetlb=0`). Elsewhere
//! than on Linux, nothing changes.

/// The tunable, as `GLIBC_TUNABLES` names it.
const TUNABLE: &str = "glibc.malloc.hugetlb";

/// The tunable's own entry (`glibc.malloc.hugetlb=…`) in a `GLIBC_TUNABLES` value.
fn entry(tunables: &str) -> Option<&str> {
    tunables.split(':').find(|t| t.split('=').next() == Some(TUNABLE))
}

/// What `GLIBC_TUNABLES` should hold given what it holds (`None`: unset): the tunable added
/// after any others, or `None` where it names the tunable already.
fn with_tunable(current: Option<&str>) -> Option<String> {
    match current.filter(|c| !c.is_empty()) {
        Some(c) if entry(c).is_some() => None,
        Some(c) => Some(format!("{c}:{TUNABLE}=1")),
        None => Some(format!("{TUNABLE}=1")),
    }
}

/// Re-executes this process with the tunable added, where it is not named yet; returns (going
/// on with the pages as they are) where it is, or where the exec fails.
#[cfg(target_os = "linux")]
pub(crate) fn ask() {
    use std::os::unix::process::CommandExt;
    let Some(value) = with_tunable(std::env::var("GLIBC_TUNABLES").ok().as_deref()) else {
        return;
    };
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        command.arg0(arg0);
    }
    // `exec` returns only when it failed.
    let _ = command.args(args).env("GLIBC_TUNABLES", value).exec();
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn ask() {}

/// One line for `siphon doctor`: what `malloc` was told, and the kernel's mode.
pub(crate) fn describe() -> String {
    let tunables = std::env::var("GLIBC_TUNABLES").ok();
    let told = tunables.as_deref().and_then(entry);
    let kernel = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok().and_then(|modes| {
        modes.split_whitespace().find(|m| m.starts_with('[')).map(|m| m.trim_matches(['[', ']']).to_string())
    });
    let kernel = kernel.map_or("the kernel's mode unknown".to_string(), |m| format!("the kernel's mode: {m}"));
    match told {
        Some(t) => format!("GLIBC_TUNABLES {t} ({kernel})"),
        None => format!("not asked of malloc: GLIBC_TUNABLES does not name {TUNABLE} ({kernel})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tunable_is_added_after_others_and_never_twice() {
        assert_eq!(with_tunable(None).as_deref(), Some("glibc.malloc.hugetlb=1"));
        assert_eq!(with_tunable(Some("")).as_deref(), Some("glibc.malloc.hugetlb=1"));
        assert_eq!(
            with_tunable(Some("glibc.malloc.arena_max=2")).as_deref(),
            Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
        );
        assert_eq!(with_tunable(Some("glibc.malloc.hugetlb=0")), None);
        assert_eq!(with_tunable(Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2")), None);
        // A longer name that starts like it is another tunable.
        assert_eq!(
            with_tunable(Some("glibc.malloc.hugetlbx=1")).as_deref(),
            Some("glibc.malloc.hugetlbx=1:glibc.malloc.hugetlb=1")
        );
    }
}
