//! What machine a report was made on.

use serde::{Deserialize, Serialize};

/// The machine, for report headers and JSON.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    /// Kernel release.
    pub kernel: String,
    /// CPU model.
    pub cpu: String,
    /// CPUs available.
    pub cores: usize,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// zswap's compressor, if zswap exists.
    pub zswap_compressor: String,
}

impl Machine {
    /// Reads it off this machine.
    pub fn detect() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let memory_bytes = read("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        Machine {
            kernel: read("/proc/sys/kernel/osrelease"),
            cpu,
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            memory_bytes,
            zswap_compressor: read("/sys/module/zswap/parameters/compressor"),
        }
    }

    /// One line.
    pub fn summary(&self) -> String {
        format!(
            "Linux {}, {} × {}, {:.1} GiB, zswap compressor {}",
            self.kernel,
            self.cores,
            if self.cpu.is_empty() { "CPU" } else { &self.cpu },
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            if self.zswap_compressor.is_empty() { "n/a" } else { &self.zswap_compressor }
        )
    }
}
