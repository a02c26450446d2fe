fn main() { print!("{}", rayshift_api::crd::to_yaml()); }
