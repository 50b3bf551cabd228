//! The virtual swap space.
