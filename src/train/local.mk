# src/train fragment
