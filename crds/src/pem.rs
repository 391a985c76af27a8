//! PEM text (RFC 7468) of ed25519 keys: base64 between `-----BEGIN X-----` and `-----END X-----`,
//! and the fixed SubjectPublicKeyInfo wrapping of a 32-byte ed25519 public key (RFC 8410).

/// The DER prefix of an ed25519 SubjectPublicKeyInfo: SEQUENCE { SEQUENCE { OID 1.3.101.112 },
/// BIT STRING (32 bytes) }.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// One PEM block.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub label: String,
    pub der: Vec<u8>,
}

/// `der` as a PEM block labelled `label`, 64 characters a line.
pub fn encode(label: &str, der: &[u8]) -> String {
    let b64 = base64(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The first PEM block of `text`.
pub fn decode(text: &str) -> Result<Block, String> {
    let begin = text
        .find("-----BEGIN ")
        .ok_or("no '-----BEGIN' line: the file is not PEM")?;
    let rest = &text[begin + "-----BEGIN ".len()..];
    let end_label = rest
        .find("-----")
        .ok_or("the BEGIN line does not end in '-----'")?;
    let label = rest[..end_label].to_string();
    let body = &rest[end_label + 5..];
    let end_marker = format!("-----END {label}-----");
    let stop = body
        .find(&end_marker)
        .ok_or_else(|| format!("no '{end_marker}' line"))?;
    let der =
        unbase64(&body[..stop]).ok_or_else(|| format!("the {label} block is not valid base64"))?;
    Ok(Block { label, der })
}

/// The SubjectPublicKeyInfo DER of a 32-byte ed25519 public key.
pub fn ed25519_spki(public_key: &[u8]) -> Vec<u8> {
    let mut der = ED25519_SPKI_PREFIX.to_vec();
    der.extend_from_slice(public_key);
    der
}

/// The 32-byte key of an ed25519 SubjectPublicKeyInfo DER.
pub fn ed25519_spki_key(der: &[u8]) -> Result<Vec<u8>, String> {
    match der.strip_prefix(&ED25519_SPKI_PREFIX[..]) {
        Some(key) if key.len() == 32 => Ok(key.to_vec()),
        _ => Err("the PUBLIC KEY is not an ed25519 key (RFC 8410 SubjectPublicKeyInfo)".into()),
    }
}

fn base64(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unbase64(text: &str) -> Option<Vec<u8>> {
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace()) {
        if c == b'=' {
            break;
        }
        let v = ALPHABET.iter().position(|a| *a == c)?;
        bits = (bits << 6) | v as u32;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_every_padding() {
        for data in [&b""[..], b"f", b"fo", b"foo", b"foob", b"fooba", b"foobar"] {
            assert_eq!(unbase64(&base64(data)).as_deref(), Some(data));
        }
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(unbase64("Zm9v!"), None);
    }

    #[test]
    fn a_pem_block_round_trips_and_bad_text_is_named() {
        let der: Vec<u8> = (0..100).collect();
        let text = encode("PUBLIC KEY", &der);
        assert!(text.lines().all(|l| l.len() <= 64));
        assert_eq!(
            decode(&format!("comment\n{text}")),
            Ok(Block {
                label: "PUBLIC KEY".into(),
                der
            })
        );
        assert!(decode("hello").is_err_and(|e| e.contains("not PEM")));
        assert!(ed25519_spki_key(&[0; 44]).is_err());
        assert_eq!(ed25519_spki_key(&ed25519_spki(&[5; 32])), Ok(vec![5; 32]));
    }
}
