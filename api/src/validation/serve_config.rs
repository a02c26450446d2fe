//! serveConfigV2 parsing.
pub fn parse_serve_config() {}
