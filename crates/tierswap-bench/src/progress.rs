//! Progress bars on a terminal, nothing when output is piped.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar that is a no-op when not shown.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar of `total` pages labelled `what`, shown if `show` and stderr is a terminal.
    pub fn new(show: bool, total: u64, what: &str) -> Progress {
        if !show || !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::new(total);
        if let Ok(style) = ProgressStyle::with_template("{msg:>24} [{bar:40}] {pos}/{len} pages {per_sec} ({eta})") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what.to_string());
        Progress { bar: Some(bar) }
    }

    /// Sets the position.
    pub fn set(&self, done: u64) {
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
