//! The process's open-file limit: raised to what the system allows, since every HTTP
//! stream holds a socket (the server's clients, the benchmark's requests).

/// Raises the soft limit on open files to the hard limit; returns the limit now in force
/// (`None` where it cannot be read, or off Unix).
pub fn raise_open_files() -> Option<u64> {
    imp::raise()
}

#[cfg(unix)]
mod imp {
    pub fn raise() -> Option<u64> {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit read and write only the struct passed.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
                lim = want;
            }
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every Unix
        Some(lim.rlim_cur as u64)
    }
}

#[cfg(not(unix))]
mod imp {
    pub fn raise() -> Option<u64> {
        None
    }
}

#[cfg(all(test, unix))]
mod tests {
    #[test]
    fn the_soft_limit_reaches_the_hard_one() {
        let now = super::raise_open_files().expect("the limit is readable");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        #[allow(clippy::unnecessary_cast)]
        let cur = lim.rlim_cur as u64;
        assert_eq!(now, cur);
        // An unlimited hard limit (some BSDs, macOS) is refused as a soft one; Linux's hard
        // limit on open files is always finite.
        if lim.rlim_max != libc::RLIM_INFINITY {
            assert_eq!(lim.rlim_cur, lim.rlim_max);
        }
    }
}
