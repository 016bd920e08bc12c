"""What a request may constrain: grammar masks (grammar, through llguidance), thinking regions (thinking)
and JSON schemas read from files (schema)."""
