# tests fragment
