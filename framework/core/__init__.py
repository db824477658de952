"""Layer 0, no model knowledge: the plugin registry, validated parameters, counter-based RNG,
measurement helpers (timing medians, peak memory). Imports nothing else from the project."""
