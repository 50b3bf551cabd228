//! Policies: pure decisions over the engine's state, no system calls.
