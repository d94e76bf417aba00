"""Model cells (compute graph) in MindSpore graph mode. Never imports engine types."""
