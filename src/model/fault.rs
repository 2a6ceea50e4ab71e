//! The faults an engine can be made to meet (`ModelHandle::inject_fault`, and the
//! `/v2/debug/fault` route of a server started with `--fault-injection`): what an
//! operator's chaos test or the repository's own checks use to see a model fail and
//! recover as it would on a real device error.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// A fault met at the engine's next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A panic inside the step (a bug in a kernel launcher): the engine restarts on the
    /// same device state.
    Panic,
    /// A kernel that writes an address outside every allocation, queued ahead of the
    /// step's: CUDA's sticky `CUDA_ERROR_ILLEGAL_ADDRESS`, which leaves the context unusable
    /// (the GPU engine only).
    IllegalAddress,
    /// The step's first launch answers an error, as a failed launch does; the context
    /// itself stays sound (the GPU engine only).
    LaunchError,
}

impl Fault {
    /// Every fault, by name.
    pub const ALL: [Fault; 3] = [Fault::Panic, Fault::IllegalAddress, Fault::LaunchError];

    /// The name requests and logs use.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Panic => "panic",
            Fault::IllegalAddress => "illegal_address",
            Fault::LaunchError => "launch_error",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fault {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                Error::InvalidRequest(format!("fault {s:?} is not one of {}", names.join(", ")))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_refused() {
        for f in Fault::ALL {
            assert_eq!(f.name().parse::<Fault>().unwrap(), f);
        }
        let e = "oom".parse::<Fault>().unwrap_err().to_string();
        assert!(
            e.contains("\"oom\"") && e.contains("illegal_address"),
            "{e}"
        );
    }
}
