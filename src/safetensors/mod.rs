//! Strict, memory-efficient safetensors reader (being built).
