"""Generated from proto/ by scripts/gen-proto; do not edit."""
