"""The CDK stack of stabilizer and the helpers it needs at synth time (no AWS calls, no Docker)."""
