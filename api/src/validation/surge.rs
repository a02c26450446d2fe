//! Surge warnings.
