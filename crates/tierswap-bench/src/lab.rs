//! The runner: every workload on every engine, runs alternating engine by engine (ABBA)
//! (A B, then B A, …) so that drift on a shared machine hits all engines alike.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::workload::WorkloadKind;
use crate::{Engine, EngineError, RunResult, RunSpec};

/// What to run.
pub struct Plan {
    /// Workloads, in order.
    pub workloads: Vec<WorkloadKind>,
    /// Runs per workload and engine.
    pub runs: usize,
    /// The run template (workload and run number are filled in per run).
    pub template: RunSpec,
}

/// What happened.
#[derive(Default)]
pub struct Outcome {
    /// Every completed run.
    pub results: Vec<RunResult>,
    /// Engines skipped, with the reason.
    pub skipped: Vec<String>,
    /// Runs tried a second time (OOM-killed kernel runs), with the reason.
    pub retried: Vec<String>,
    /// Runs that failed, one line each.
    pub failures: Vec<String>,
    /// Stopped early by Ctrl-C / SIGTERM / SIGHUP.
    pub interrupted: bool,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Makes SIGINT, SIGTERM and SIGHUP (a closed terminal) stop the lab between runs (engines
/// then tear down as usual, putting the machine back). A second signal kills the process
/// the default way; the next lab, or `tierswap bench restore`, then puts it back.
pub fn install_interrupt_handler() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe; SA_RESETHAND
    // restores the default action so a second Ctrl-C ends the process.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESETHAND;
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGHUP, &sa, std::ptr::null_mut());
    }
}

/// Whether SIGINT, SIGTERM or SIGHUP arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Touches and frees `bytes` of memory once, so the host has handed the guest its pages
/// before anything is timed (docs/design.md, Alternation and warm-up: the first touch of memory idle for a while is slow).
pub fn warm_up(bytes: u64) {
    let mut v = vec![0u8; bytes as usize];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    std::hint::black_box(&v);
}

/// Runs the plan on the engines. Engines that cannot run here are skipped; a failed run is
/// recorded and the others go on. Every engine set up is torn down, also on interrupt.
pub fn run(plan: &Plan, engines: &mut [Box<dyn Engine>], log: &mut dyn FnMut(&str)) -> Outcome {
    let mut out = Outcome::default();
    let mut live: Vec<usize> = Vec::new();
    for (i, e) in engines.iter_mut().enumerate() {
        match e.setup() {
            Ok(()) => live.push(i),
            Err(err) => {
                let line = err.to_string();
                log(&line);
                out.skipped.push(line);
            }
        }
    }
    if !live.is_empty() {
        warm_up(plan.template.size_bytes);
    }
    'all: for &w in &plan.workloads {
        for run in 0..plan.runs {
            // ABBA: the engine that goes first in a round pays for memory the host took
            // back since the last round (measured here: up to 20 % on the refault), so the
            // order reverses every round.
            let order: Vec<usize> = if run % 2 == 0 { live.clone() } else { live.iter().rev().copied().collect() };
            for &i in &order {
                if interrupted() {
                    out.interrupted = true;
                    break 'all;
                }
                let spec = RunSpec { workload: w, run, ..plan.template.clone() };
                let mut result = engines[i].run(&spec);
                if let Err(e @ EngineError::OomKilled { .. }) = &result {
                    // memcg v1 does not charge zswap's pool or zram: the kernel can fail to
                    // reclaim in time. One more try, said out loud.
                    let line = format!("{e} (run {}); retrying once", run + 1);
                    log(&line);
                    out.retried.push(line);
                    result = engines[i].run(&spec);
                }
                match result {
                    Ok(r) => {
                        log(&format!(
                            "{:<16} {:<24} run {}: refault {:.3} s, {} pages verified, {} mismatches",
                            w.name(),
                            r.engine,
                            run + 1,
                            r.refault_s,
                            r.pages_verified,
                            r.mismatches
                        ));
                        out.results.push(r);
                    }
                    Err(e @ EngineError::Unavailable { .. }) => {
                        // This engine does not do this workload: a skip, said once.
                        let line = format!("{e} (workload {})", w.name());
                        if !out.skipped.contains(&line) {
                            log(&line);
                            out.skipped.push(line);
                        }
                    }
                    Err(e @ EngineError::OomKilled { .. }) | Err(e @ EngineError::Failed { .. }) => {
                        let line = e.to_string();
                        log(&line);
                        out.failures.push(line);
                    }
                }
            }
        }
    }
    for &i in &live {
        engines[i].teardown();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EngineKind;

    struct Fake {
        kind: EngineKind,
        available: bool,
        calls: std::rc::Rc<std::cell::RefCell<Vec<String>>>,
        /// What successive runs do: "ok", "oom" or "skip"; "ok" once it runs out.
        script: Vec<&'static str>,
    }

    impl Engine for Fake {
        fn kind(&self) -> EngineKind {
            self.kind
        }
        fn setup(&mut self) -> Result<(), EngineError> {
            if self.available {
                Ok(())
            } else {
                Err(EngineError::Unavailable { engine: self.kind.name().into(), reason: "not here".into() })
            }
        }
        fn run(&mut self, spec: &RunSpec) -> Result<RunResult, EngineError> {
            self.calls.borrow_mut().push(format!("{}:{}:{}", spec.workload.name(), self.kind.name(), spec.run));
            let step = if self.script.is_empty() { "ok" } else { self.script.remove(0) };
            if step == "oom" {
                return Err(EngineError::OomKilled {
                    engine: self.kind.name().into(),
                    workload: spec.workload.name().into(),
                    budget_mib: 1,
                });
            }
            if step == "skip" {
                return Err(EngineError::Unavailable {
                    engine: self.kind.name().into(),
                    reason: "not this workload".into(),
                });
            }
            Ok(RunResult {
                workload: spec.workload.name().into(),
                engine: self.kind.name().into(),
                run: spec.run,
                refault_s: 1.0,
                ..Default::default()
            })
        }
        fn teardown(&mut self) {
            self.calls.borrow_mut().push(format!("teardown:{}", self.kind.name()));
        }
    }

    #[test]
    fn alternates_engines_and_skips_unavailable_ones() {
        let calls = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut engines: Vec<Box<dyn Engine>> = vec![
            Box::new(Fake { kind: EngineKind::Tierswap, available: true, calls: calls.clone(), script: vec![] }),
            Box::new(Fake { kind: EngineKind::KernelZram, available: false, calls: calls.clone(), script: vec![] }),
            Box::new(Fake { kind: EngineKind::KernelZswap, available: true, calls: calls.clone(), script: vec![] }),
        ];
        let mut lines = Vec::new();
        let out = run(&plan(2), &mut engines, &mut |l| lines.push(l.to_string()));
        assert_eq!(
            *calls.borrow(),
            vec![
                "seq64:tierswap:0",
                "seq64:kernel-zswap:0",
                "seq64:kernel-zswap:1",
                "seq64:tierswap:1",
                "teardown:tierswap",
                "teardown:kernel-zswap"
            ]
        );
        assert_eq!(out.results.len(), 4);
        assert_eq!(out.skipped.len(), 1);
        assert!(out.skipped[0].contains("kernel-zram skipped: not here"));
    }

    fn plan(runs: usize) -> Plan {
        Plan {
            workloads: vec![WorkloadKind::Seq64],
            runs,
            template: RunSpec {
                workload: WorkloadKind::Seq64,
                size_bytes: 4096,
                budget_bytes: 4096,
                threads: 1,
                run: 0,
                pager: Default::default(),
            },
        }
    }

    #[test]
    fn an_oom_killed_run_is_retried_once_and_said() {
        let calls = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut engines: Vec<Box<dyn Engine>> = vec![Box::new(Fake {
            kind: EngineKind::KernelZswap,
            available: true,
            calls: calls.clone(),
            script: vec!["oom", "ok", "oom", "oom"],
        })];
        let out = run(&plan(2), &mut engines, &mut |_| {});
        assert_eq!(out.results.len(), 1, "run 0 succeeded on its retry, run 1 did not");
        assert_eq!(out.retried.len(), 2);
        assert_eq!(out.failures.len(), 1);
        assert!(out.failures[0].contains("OOM-killed"), "{:?}", out.failures);
        assert_eq!(calls.borrow().len(), 4 + 1, "four runs and the teardown");
    }

    #[test]
    fn an_engine_that_does_not_do_a_workload_is_skipped_not_failed() {
        let calls = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut engines: Vec<Box<dyn Engine>> = vec![Box::new(Fake {
            kind: EngineKind::KernelZram,
            available: true,
            calls: calls.clone(),
            script: vec!["skip", "skip", "skip"],
        })];
        let out = run(&plan(3), &mut engines, &mut |_| {});
        assert!(out.failures.is_empty() && out.results.is_empty());
        assert_eq!(out.skipped.len(), 1, "said once: {:?}", out.skipped);
    }
}
