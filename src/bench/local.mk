# src/bench fragment
