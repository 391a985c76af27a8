//! The cluster CA and kube-apiserver's serving certificate for a real node: pods check the
//! server against the CA (their `kube-root-ca.crt`), by the address they dial.

use std::net::Ipv4Addr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

pub struct ClusterCerts {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
}

impl ClusterCerts {
    /// A CA, and a serving certificate it signs for `address` (the `kubernetes` ClusterIP),
    /// 127.0.0.1 and the `kubernetes` Service's DNS names.
    pub fn generate(address: Ipv4Addr) -> Result<Self, String> {
        let err = |what: &str| {
            let what = what.to_string();
            move |e: rcgen::Error| format!("{what}: {e}")
        };
        let ca_key = KeyPair::generate().map_err(err("generate the CA key"))?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err("CA"))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca_params.distinguished_name = name("gpuval-test-cluster-ca");
        let ca = ca_params
            .self_signed(&ca_key)
            .map_err(err("self-sign the CA"))?;
        let issuer = Issuer::new(ca_params, ca_key);

        let key = KeyPair::generate().map_err(err("generate the serving key"))?;
        let sans: Vec<String> = [
            address.to_string(),
            "127.0.0.1".into(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            "kubernetes.default.svc.cluster.local".into(),
            "localhost".into(),
        ]
        .into();
        let mut params = CertificateParams::new(sans).map_err(err("serving certificate"))?;
        params.distinguished_name = name("kube-apiserver");
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(err("sign the serving certificate"))?;
        Ok(Self {
            ca_pem: ca.pem(),
            serving_cert_pem: cert.pem(),
            serving_key_pem: key.serialize_pem(),
        })
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}
