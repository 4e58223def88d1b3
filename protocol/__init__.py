"""What every Elastane daemon shares: records, wire codec, tokens, HTTP helpers, config."""
