//! Certificate tooling: a CA and a serving certificate for the webhook Service, and the webhook
//! configurations with that CA as `caBundle`.
//!
//! Files use the Kubernetes TLS Secret names (`tls.crt`, `tls.key`, `ca.crt`), so a directory can be
//! turned into a Secret as is. Private keys are written with mode 0600.

use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    net::IpAddr,
    path::{Path, PathBuf},
};

use base64::Engine;
use k8s_openapi::{
    ByteString,
    api::admissionregistration::v1::{
        MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
        ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta},
};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};

use crate::{
    error::{Error, Result},
    server::{MUTATE_PATH, VALIDATE_PATH},
};

pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
const CA_VALID_DAYS: i64 = 3650;

/// What to put in the serving certificate.
#[derive(Clone, Debug)]
pub struct ServingCertRequest {
    pub service: String,
    pub namespace: String,
    pub ips: Vec<IpAddr>,
    pub extra_dns: Vec<String>,
    pub valid_days: i64,
}

impl ServingCertRequest {
    /// The names the apiserver may use to reach the Service.
    pub fn dns_names(&self) -> Vec<String> {
        let (s, ns) = (&self.service, &self.namespace);
        let mut names = vec![
            s.clone(),
            format!("{s}.{ns}"),
            format!("{s}.{ns}.svc"),
            format!("{s}.{ns}.svc.cluster.local"),
        ];
        names.extend(self.extra_dns.iter().cloned());
        names
    }
}

/// Paths written by [`generate`].
#[derive(Clone, Debug)]
pub struct GeneratedFiles {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(unix_now());
    // Backdate a little so clocks that are slightly behind still accept the certificate.
    params.not_before = now - std::time::Duration::from_secs(300);
    params.not_after = now + std::time::Duration::from_secs(days.max(1) as u64 * 86_400);
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "rayshift webhook CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, CA_VALID_DAYS);
    params
}

/// Writes a CA (unless `reuse_ca` and one exists in `out`) and a serving certificate signed by it.
pub fn generate(req: &ServingCertRequest, out: &Path, reuse_ca: bool) -> Result<GeneratedFiles> {
    fs::create_dir_all(out).map_err(|source| Error::CreateDir {
        path: out.to_path_buf(),
        source,
    })?;
    let files = GeneratedFiles {
        ca_cert: out.join(CA_CERT),
        ca_key: out.join(CA_KEY),
        tls_cert: out.join(TLS_CERT),
        tls_key: out.join(TLS_KEY),
    };
    let (ca_pem, ca_key) = if reuse_ca && files.ca_cert.exists() && files.ca_key.exists() {
        let key = KeyPair::from_pem(&read(&files.ca_key)?)?;
        (read(&files.ca_cert)?, key)
    } else {
        let key = KeyPair::generate()?;
        let cert = ca_params().self_signed(&key)?;
        write(&files.ca_cert, cert.pem().as_bytes(), false)?;
        write(&files.ca_key, key.serialize_pem().as_bytes(), true)?;
        (cert.pem(), key)
    };
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;

    let mut params = CertificateParams::new(req.dns_names())?;
    params
        .subject_alt_names
        .extend(req.ips.iter().map(|ip| SanType::IpAddress(*ip)));
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("{}.{}.svc", req.service, req.namespace),
    );
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params, req.valid_days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    write(&files.tls_key, key.serialize_pem().as_bytes(), true)?;
    write(&files.tls_cert, cert.pem().as_bytes(), false)?;
    Ok(files)
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(Error::read_file(path))
}

/// Writes atomically (temp file + rename), so a server reloading the directory never sees half a file.
fn write(path: &Path, bytes: &[u8], secret: bool) -> Result<()> {
    let err = |source: std::io::Error| Error::WriteFile {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(if secret { 0o600 } else { 0o644 });
    }
    let mut f = opts.open(&tmp).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    fs::rename(&tmp, path).map_err(err)
}

/// Where the apiserver reaches the webhook.
#[derive(Clone, Debug)]
pub enum Endpoint {
    Service {
        name: String,
        namespace: String,
        port: i32,
    },
    Url(String),
}

/// Inputs of [`webhook_configurations`].
#[derive(Clone, Debug)]
pub struct WebhookConfigRequest {
    pub ca_pem: Vec<u8>,
    pub endpoint: Endpoint,
    /// The webhook's own namespace, excluded so a broken webhook cannot lock itself out.
    pub exclude_namespace: Option<String>,
    /// Only namespaces with these labels are admitted (opt-in rollout); empty means all.
    pub namespace_labels: BTreeMap<String, String>,
    pub name: String,
}

const RULE_OPERATIONS: [&str; 2] = ["CREATE", "UPDATE"];

fn client_config(req: &WebhookConfigRequest, path: &str) -> WebhookClientConfig {
    let ca_bundle = Some(ByteString(req.ca_pem.clone()));
    match &req.endpoint {
        Endpoint::Service {
            name,
            namespace,
            port,
        } => WebhookClientConfig {
            ca_bundle,
            service: Some(ServiceReference {
                name: name.clone(),
                namespace: namespace.clone(),
                path: Some(path.to_string()),
                port: Some(*port),
            }),
            url: None,
        },
        Endpoint::Url(base) => WebhookClientConfig {
            ca_bundle,
            service: None,
            url: Some(format!("{}{path}", base.trim_end_matches('/'))),
        },
    }
}

fn rules() -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        api_groups: Some(vec!["ray.io".into()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(RULE_OPERATIONS.iter().map(|s| s.to_string()).collect()),
        resources: Some(vec!["rayservices".into()]),
        scope: Some("Namespaced".into()),
    }]
}

fn namespace_selector(req: &WebhookConfigRequest) -> Option<LabelSelector> {
    let exclude = req.exclude_namespace.clone().map(|ns| {
        vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "NotIn".into(),
            values: Some(vec![ns]),
        }]
    });
    let labels = (!req.namespace_labels.is_empty()).then(|| req.namespace_labels.clone());
    (exclude.is_some() || labels.is_some()).then_some(LabelSelector {
        match_expressions: exclude,
        match_labels: labels,
    })
}

fn meta(name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/name".to_string(),
            "rayshift".to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

/// The Validating and Mutating webhook configurations for RayService, as one YAML stream.
pub fn webhook_configurations(req: &WebhookConfigRequest) -> Result<String> {
    let validating = ValidatingWebhookConfiguration {
        metadata: meta(format!("{}-validating", req.name)),
        webhooks: Some(vec![ValidatingWebhook {
            name: "vrayservice.rayshift.io".into(),
            admission_review_versions: vec!["v1".into()],
            client_config: client_config(req, VALIDATE_PATH),
            failure_policy: Some("Fail".into()),
            match_policy: Some("Equivalent".into()),
            namespace_selector: namespace_selector(req),
            rules: Some(rules()),
            side_effects: "None".into(),
            timeout_seconds: Some(5),
            ..ValidatingWebhook::default()
        }]),
    };
    let mutating = MutatingWebhookConfiguration {
        metadata: meta(format!("{}-mutating", req.name)),
        webhooks: Some(vec![MutatingWebhook {
            name: "mrayservice.rayshift.io".into(),
            admission_review_versions: vec!["v1".into()],
            client_config: client_config(req, MUTATE_PATH),
            failure_policy: Some("Fail".into()),
            match_policy: Some("Equivalent".into()),
            namespace_selector: namespace_selector(req),
            reinvocation_policy: Some("IfNeeded".into()),
            rules: Some(rules()),
            side_effects: "None".into(),
            timeout_seconds: Some(5),
            ..MutatingWebhook::default()
        }]),
    };
    let mut out = String::new();
    for doc in [
        typed_yaml(
            &validating,
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
        )?,
        typed_yaml(
            &mutating,
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
        )?,
    ] {
        out.push_str("---\n");
        out.push_str(&doc);
    }
    Ok(out)
}

/// k8s-openapi's structs serialize without apiVersion/kind unless wrapped; add them up front.
fn typed_yaml(obj: &impl serde::Serialize, api_version: &str, kind: &str) -> Result<String> {
    let body = serde_json::to_value(obj).map_err(Error::EncodeManifest)?;
    let mut doc = serde_json::Map::new();
    doc.insert("apiVersion".into(), api_version.into());
    doc.insert("kind".into(), kind.into());
    if let serde_json::Value::Object(fields) = body {
        doc.extend(
            fields
                .into_iter()
                .filter(|(k, _)| k != "apiVersion" && k != "kind"),
        );
    }
    Ok(yaml_serde::to_string(&doc)?)
}

/// The base64 `caBundle` value of a PEM file, as it appears in the configurations.
pub fn ca_bundle_b64(ca_pem: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(ca_pem)
}
