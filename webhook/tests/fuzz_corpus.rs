//! Replays the fuzzing corpus (`fuzz/seeds/`, and `fuzz/corpus/` as `scripts/bench.sh fuzz` grows it)
//! through the admission handlers with the fuzz target's checks: every input that once found a new path
//! stays a regression test without libFuzzer.

use std::path::Path;

use rayshift_webhook::{
    admission::{self, AdmissionConfig, Hook},
    error::Error,
};

fn inputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect()
}

#[test]
fn every_corpus_input_gets_an_answer_or_a_client_error() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let seeds = inputs(&fuzz.join("seeds"));
    let corpus = inputs(&fuzz.join("corpus/admission_review"));
    assert!(seeds.len() >= 100, "{} seeds", seeds.len());
    let config = AdmissionConfig::incremental();
    let (mut answered, mut refused) = (0, 0);
    for (name, body) in seeds.iter().chain(&corpus) {
        for hook in [Hook::Validate, Hook::Mutate] {
            match admission::review(hook, body, &config) {
                Ok((review, record)) => {
                    assert_eq!(
                        review["response"]["allowed"].as_bool(),
                        Some(record.allowed),
                        "{name}"
                    );
                    assert_eq!(review["kind"], "AdmissionReview", "{name}");
                    answered += 1;
                }
                Err(e) => {
                    assert!(
                        matches!(e, Error::BadRequest(ref why) if !why.to_string().is_empty()),
                        "{name}: {e}"
                    );
                    refused += 1;
                }
            }
        }
    }
    // The seeds are well-formed reviews of the rule fixtures: each gets an answer.
    assert!(
        answered >= 2 * seeds.len(),
        "answered {answered}, refused {refused}"
    );
    eprintln!(
        "{} seeds, {} corpus inputs: {answered} answers, {refused} client errors",
        seeds.len(),
        corpus.len()
    );
}
