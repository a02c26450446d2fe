//! The SLO checks' queries, sent to Prometheus (`--prometheus-url`) as instant queries. Whatever goes wrong
//! becomes a reading that is not a pass (no data, or unavailable with Prometheus's own words), so a step
//! never goes on a check nobody could evaluate.

use std::time::Duration;

use rayshift_api::slo::{Bindings, Evaluation, Reading, SloCheck, render};
use serde::Deserialize;

use crate::error::{Error, Result};

/// A Prometheus server's HTTP API.
#[derive(Clone)]
pub struct Prometheus {
    http: reqwest::Client,
    query_url: String,
}

/// `GET /api/v1/query`'s answer (success or error). A range vector or a string does not decode: a check
/// needs an instant vector or a scalar, and the reading says so.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    status: String,
    data: Option<Data>,
    error_type: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", tag = "resultType", content = "result")]
enum Data {
    Vector(Vec<Series>),
    Scalar((f64, String)),
}

#[derive(Deserialize)]
struct Series {
    value: (f64, String),
}

impl Prometheus {
    /// `base` is the server's root, e.g. `http://prometheus.monitoring:9090`.
    pub fn new(base: &str, timeout: Duration) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .map_err(Error::HttpClient)?;
        Ok(Self {
            http,
            query_url: format!("{}/api/v1/query", base.trim_end_matches('/')),
        })
    }

    /// The query's value now.
    pub async fn query(&self, promql: &str) -> Reading {
        crate::waiting::on(crate::waiting::Waiting::Prometheus);
        let sent = self.http.get(&self.query_url).query(&[("query", promql)]).send();
        let answer = match sent.await {
            Ok(response) => response.json::<Answer>().await,
            Err(e) => return Reading::Unavailable(format!("Prometheus {}: {e}", self.query_url)),
        };
        match answer {
            Ok(a) => reading(a),
            Err(e) => Reading::Unavailable(format!("Prometheus {}: not an API answer: {e}", self.query_url)),
        }
    }
}

fn reading(a: Answer) -> Reading {
    if a.status != "success" {
        let kind = a.error_type.unwrap_or_default();
        return Reading::Unavailable(format!(
            "Prometheus refused the query: {kind}: {}",
            a.error.unwrap_or_default()
        ));
    }
    let value = |text: &str| match text.parse::<f64>() {
        Ok(v) => Reading::Value(v),
        Err(_) => Reading::Unavailable(format!("Prometheus returned {text:?}, not a number")),
    };
    match a.data {
        Some(Data::Scalar((_, v))) => value(&v),
        Some(Data::Vector(series)) => match series.as_slice() {
            [] => Reading::NoData,
            [one] => value(&one.value.1),
            many => Reading::Unavailable(format!(
                "the query returned {} series; a check needs one (aggregate it, e.g. with sum)",
                many.len()
            )),
        },
        None => Reading::Unavailable("Prometheus answered success without data".to_string()),
    }
}

/// Evaluates the checks that are due for one upgrade, each with its own window.
pub async fn evaluate<'a>(
    prometheus: Option<&Prometheus>,
    checks: &[&'a SloCheck],
    bindings: Bindings<'_>,
) -> Vec<Evaluation> {
    let one = |check: &'a SloCheck| {
        let query = render(
            &check.query,
            &Bindings {
                window_seconds: check.window_seconds,
                ..bindings.clone()
            },
        );
        async move {
            let reading = match prometheus {
                Some(p) => p.query(&query).await,
                None => Reading::Unavailable(
                    "the controller has no --prometheus-url to evaluate SLO checks with".to_string(),
                ),
            };
            Evaluation {
                check: check.name.clone(),
                query,
                reading,
            }
        }
    };
    futures::future::join_all(checks.iter().map(|c| one(c))).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> Reading {
        reading(serde_json::from_str(json).unwrap())
    }

    #[test]
    fn answers_become_readings() {
        let vector =
            |r: &str| format!(r#"{{"status":"success","data":{{"resultType":"vector","result":{r}}}}}"#);
        assert_eq!(
            read(&vector(r#"[{"metric":{},"value":[1.5,"0.25"]}]"#)),
            Reading::Value(0.25)
        );
        assert_eq!(read(&vector("[]")), Reading::NoData);
        assert!(
            matches!(read(&vector(r#"[{"metric":{},"value":[1.5,"NaN"]}]"#)), Reading::Value(v) if v.is_nan())
        );
        let two = vector(r#"[{"metric":{"a":"1"},"value":[1,"1"]},{"metric":{"a":"2"},"value":[1,"2"]}]"#);
        assert!(matches!(read(&two), Reading::Unavailable(why) if why.contains("returned 2 series")));
        let scalar = r#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"+Inf"]}}"#;
        assert_eq!(read(scalar), Reading::Value(f64::INFINITY));
        let error = r#"{"status":"error","errorType":"bad_data","error":"parse error at char 4"}"#;
        assert_eq!(
            read(error),
            Reading::Unavailable("Prometheus refused the query: bad_data: parse error at char 4".into())
        );
    }
}
