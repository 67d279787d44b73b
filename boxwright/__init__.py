"""boxwright."""
