"""Layer 5: predictions as typed results, tables (pandas), JSON and Chrome traces."""
