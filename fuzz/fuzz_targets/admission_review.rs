//! Any body sent to the admission endpoints: an answer or a 4xx error, never a panic, and an answer
//! that says what the record says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rayshift_webhook::admission::{self, AdmissionConfig, Hook};

fuzz_target!(|body: &[u8]| {
    let config = AdmissionConfig::incremental();
    for hook in [Hook::Validate, Hook::Mutate] {
        if let Ok((review, record)) = admission::review(hook, body, &config) {
            assert_eq!(review["response"]["allowed"].as_bool(), Some(record.allowed));
            assert_eq!(review["kind"], "AdmissionReview");
        }
    }
});
