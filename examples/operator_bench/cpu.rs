//! CPU time of the processes under test (the operator, the API emulator, this benchmark) and
//! of the rest of the machine, over an interval.

use serde_json::{Value, json};

use crate::bench_support::procs::{MachineTicks, cpu_ticks};

/// CPU ticks of the processes that matter, and of the whole machine, at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ticks {
    pub operator: u64,
    pub emulator: u64,
    pub bench: u64,
    pub machine: u64,
}

impl Ticks {
    pub fn take(operator: u32, emulator: u32) -> Self {
        Self {
            operator: cpu_ticks(&format!("/proc/{operator}/stat")),
            emulator: cpu_ticks(&format!("/proc/{emulator}/stat")),
            bench: cpu_ticks("/proc/self/stat"),
            machine: MachineTicks::read().busy(),
        }
    }

    /// CPU seconds spent between `self` and `later`.
    pub fn until(&self, later: &Ticks, ticks_per_sec: u64) -> Cpu {
        let s = |a: u64, b: u64| b.saturating_sub(a) as f64 / ticks_per_sec.max(1) as f64;
        let operator = s(self.operator, later.operator);
        let emulator = s(self.emulator, later.emulator);
        let bench = s(self.bench, later.bench);
        let machine = s(self.machine, later.machine);
        Cpu {
            operator,
            emulator,
            bench,
            other: (machine - operator - emulator - bench).max(0.0),
        }
    }
}

/// CPU seconds over an interval.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub operator: f64,
    pub emulator: f64,
    pub bench: f64,
    /// Everything else on the machine: noise.
    pub other: f64,
}

impl Cpu {
    pub fn to_json(self) -> Value {
        json!({
            "operator_s": self.operator, "emulator_s": self.emulator,
            "bench_s": self.bench, "other_processes_s": self.other,
        })
    }
}
