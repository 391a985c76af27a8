//! Simulated backend (tests and demos only).
