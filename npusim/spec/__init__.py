"""Layer 1: typed, validated, unit-aware specs loaded from YAML (chips, systems, models, plans, scenarios)."""
