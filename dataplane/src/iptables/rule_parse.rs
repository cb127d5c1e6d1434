//! Reading an iptables rule as written after `-A <chain> `: its words (quotes kept
//! together), and the match and target pieces of the rule shapes [`super::direct`] encodes
//! over netlink ([`encodable`] says which shapes those are).

use std::net::Ipv4Addr;

/// A rule's words, a double-quoted string being one word (flagged: a quoted word is
/// always a value), and whether every quote was closed.
pub(super) fn rule_words(rule: &str) -> (Vec<(String, bool)>, bool) {
    let mut words: Vec<(String, bool)> = Vec::new();
    let mut quoted: Option<String> = None;
    for w in rule.split_whitespace() {
        match quoted.as_mut() {
            Some(q) => {
                q.push(' ');
                q.push_str(w);
            }
            None if w.starts_with('"') => quoted = Some(w.to_string()),
            None => words.push((w.to_string(), false)),
        }
        if let Some(q) = quoted.as_ref() {
            if q.len() > 1 && q.ends_with('"') {
                words.push((q.trim_matches('"').to_string(), true));
                quoted = None;
            }
        }
    }
    let closed = quoted.is_none();
    if let Some(q) = quoted {
        words.push((q.trim_matches('"').to_string(), true));
    }
    (words, closed)
}

/// A rule's parts, as iptables-nft turns them into expressions.
#[derive(Debug, PartialEq)]
pub(super) struct Rule<'a> {
    pub(super) proto: Option<u8>,
    pub(super) src: Option<Addr>,
    pub(super) dst: Option<Addr>,
    pub(super) matches: Vec<Match>,
    pub(super) target: Target<'a>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Addr {
    pub(super) negated: bool,
    pub(super) ip: Ipv4Addr,
    pub(super) prefix: u8,
}

#[derive(Debug, PartialEq)]
pub(super) enum Match {
    /// `-m tcp` / `-m udp`: with `--dport`, native payload; without, the xtables match.
    Port {
        name: &'static str,
        dport: Option<u16>,
    },
    Comment(String),
    /// `-m statistic --mode random --probability p`, the probability as the kernel's 2^31
    /// fixed point; both options are required, in that order.
    Random {
        mode: bool,
        probability: Option<u32>,
    },
}

#[derive(Debug, PartialEq)]
pub(super) enum Target<'a> {
    Jump(&'a str),
    Dnat(Ipv4Addr, u16),
    OrMark(u32),
}

/// Whether `rule` (the text after `-A <chain> `) is one [`super::direct`] writes.
pub fn encodable(rule: &str) -> bool {
    parse(rule).is_some()
}

/// The rule's words, when its quoting is plain (no escaped or unterminated quotes).
fn words(rule: &str) -> Option<Vec<String>> {
    let (words, closed) = rule_words(rule);
    if !closed
        || words
            .iter()
            .any(|(w, _)| w.contains('\\') || w.contains('"'))
    {
        return None;
    }
    Some(words.into_iter().map(|(w, _)| w).collect())
}

/// A port as iptables reads it: plain decimal (a leading zero would be octal to it).
fn number(s: &str) -> Option<u16> {
    let plain = s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    plain.then(|| s.parse().ok()).flatten()
}

fn parse_addr(s: &str, negated: bool) -> Option<Addr> {
    let (ip, prefix) = match s.split_once('/') {
        Some((ip, p)) => (ip, p.parse().ok()?),
        None => (s, 32),
    };
    // A /0 is no match at all; iptables writes no expression for it.
    if !(1..=32).contains(&prefix) {
        return None;
    }
    Some(Addr {
        negated,
        ip: ip.parse().ok()?,
        prefix,
    })
}

pub(super) fn parse(rule: &str) -> Option<Rule<'_>> {
    let words = words(rule)?;
    let mut it = words.iter().map(String::as_str);
    let mut r = Rule {
        proto: None,
        src: None,
        dst: None,
        matches: Vec::new(),
        target: Target::Jump(""),
    };
    let mut target = None;
    let mut negated = false;
    while let Some(w) = it.next() {
        if negated && w != "-s" && w != "-d" {
            return None;
        }
        match w {
            "!" => {
                negated = true;
                continue;
            }
            "-s" if r.src.is_none() => r.src = Some(parse_addr(it.next()?, negated)?),
            "-d" if r.dst.is_none() => r.dst = Some(parse_addr(it.next()?, negated)?),
            "-p" if r.proto.is_none() => {
                r.proto = Some(match it.next()? {
                    "tcp" => 6,
                    "udp" => 17,
                    _ => return None,
                })
            }
            "-m" => r.matches.push(match it.next()? {
                "tcp" => Match::Port {
                    name: "tcp",
                    dport: None,
                },
                "udp" => Match::Port {
                    name: "udp",
                    dport: None,
                },
                "comment" => Match::Comment(String::new()),
                "statistic" => Match::Random {
                    mode: false,
                    probability: None,
                },
                _ => return None,
            }),
            "--dport" => match r.matches.last_mut() {
                Some(Match::Port {
                    dport: d @ None, ..
                }) => *d = Some(number(it.next()?)?),
                _ => return None,
            },
            "--comment" => match r.matches.last_mut() {
                Some(Match::Comment(c)) if c.is_empty() => {
                    let text = it.next()?;
                    // xt_comment holds 255 bytes and a NUL; the words dropped runs of
                    // blanks, which iptables keeps, so the text must stand as it was.
                    let verbatim = rule.contains(&format!("\"{text}\""))
                        || !text.contains(' ') && rule.contains(text);
                    if text.is_empty() || text.len() > 255 || !verbatim {
                        return None;
                    }
                    *c = text.to_string();
                }
                _ => return None,
            },
            "--mode" => match (r.matches.last_mut(), it.next()?) {
                (
                    Some(Match::Random {
                        mode: m @ false,
                        probability: None,
                    }),
                    "random",
                ) => *m = true,
                _ => return None,
            },
            "--probability" => match r.matches.last_mut() {
                Some(Match::Random {
                    mode: true,
                    probability: p @ None,
                }) => {
                    let v: f64 = it.next()?.parse().ok()?;
                    if !(0.0..=1.0).contains(&v) {
                        return None;
                    }
                    // libxt_statistic: lround(0x80000000 * probability).
                    *p = Some((v * f64::from(0x8000_0000u32)).round() as u32);
                }
                _ => return None,
            },
            "-j" if target.is_none() => {
                target = Some(match it.next()? {
                    "DNAT" => {
                        if it.next()? != "--to-destination" {
                            return None;
                        }
                        // Every endpoint we write has a port; the address-only form is
                        // left to the restore rather than encoded untested.
                        let (ip, port) = it.next()?.split_once(':')?;
                        Target::Dnat(ip.parse().ok()?, number(port)?)
                    }
                    "MARK" => {
                        if it.next()? != "--or-mark" {
                            return None;
                        }
                        // We write marks in hex; anything else is the restore's to parse.
                        let m = it.next()?.strip_prefix("0x")?;
                        Target::OrMark(u32::from_str_radix(m, 16).ok()?)
                    }
                    chain if chain.starts_with("KUBE-") => {
                        // The borrow must come from `rule`, not from `words`.
                        let at = rule.rfind(chain)?;
                        Target::Jump(&rule[at..at + chain.len()])
                    }
                    _ => return None,
                })
            }
            _ => return None,
        }
        negated = false;
    }
    // A `!` before nothing, or a DNAT without the protocol iptables requires for a port.
    if negated || (matches!(target, Some(Target::Dnat(..))) && r.proto.is_none()) {
        return None;
    }
    r.target = target?;
    for m in &r.matches {
        match m {
            Match::Port { name, .. } => {
                // `-m tcp` belongs with `-p tcp`, as in every rule we write.
                let want = if *name == "tcp" { 6 } else { 17 };
                if r.proto != Some(want) {
                    return None;
                }
            }
            Match::Comment(c) if c.is_empty() => return None,
            Match::Random {
                probability: None, ..
            } => return None,
            _ => {}
        }
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shapes_our_layout_writes_parse_and_others_do_not() {
        for ok in [
            "-s 10.0.0.1/32 -j KUBE-MARK-MASQ",
            "-m tcp -p tcp -j DNAT --to-destination 10.0.0.1:8080",
            "-m comment --comment \"ns/svc:http cluster IP\" -m tcp -p tcp -d 172.16.0.1/32 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ",
            "-m statistic --mode random --probability 0.1000000000 -j KUBE-SEP-AAAA",
            "-j KUBE-SEP-AAAA",
            "-j MARK --or-mark 0x4000",
            "-m comment --comment ns/svc:http -s 10.0.0.1/32 -j KUBE-MARK-MASQ",
        ] {
            assert!(encodable(ok), "{ok}");
        }
        for not in [
            "-m recent --name KUBE-SEP-AAAA --set -m tcp -p tcp -j DNAT --to-destination 10.0.0.1:80",
            "-m mark ! --mark 0x4000/0x4000 -j RETURN",
            "-j MASQUERADE --random-fully",
            "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
            "-s fd00::1/128 -j KUBE-MARK-MASQ",
            "-m udp -p udp -j DNAT --to-destination 10.0.0.1",
            "-j DNAT --to-destination 10.0.0.1:80",
            "-m tcp -p tcp -j DNAT --to-destination 10.0.0.1:080",
            "-m tcp -p tcp --dport +80 -j KUBE-SVC-X",
            "-m comment --comment \"two  spaces\" -j KUBE-SVC-X",
            "-j KUBE-SVC-X !",
            "-m tcp -p udp -j DNAT --to-destination 10.0.0.1:80",
            "! -p tcp -j KUBE-MARK-MASQ",
            "-s 0.0.0.0/0 -j KUBE-MARK-MASQ",
            "-j ACCEPT",
            "-m statistic --mode nth --every 2 -j KUBE-SEP-AAAA",
            "-m statistic --probability 0.5 -j KUBE-SEP-AAAA",
            "-j MARK --or-mark 16384",
            "-m comment --comment \"unterminated -j KUBE-SEP-AAAA",
        ] {
            assert!(!encodable(not), "{not}");
        }
        let r = parse("-m tcp -p tcp -d 172.16.0.1/32 --dport 80 ! -s 10.96.0.0/12 -j KUBE-SVC-X")
            .unwrap();
        assert_eq!(r.proto, Some(6));
        assert_eq!(
            r.src,
            Some(Addr {
                negated: true,
                ip: Ipv4Addr::new(10, 96, 0, 0),
                prefix: 12
            })
        );
        assert_eq!(r.target, Target::Jump("KUBE-SVC-X"));
        assert_eq!(
            r.matches,
            vec![Match::Port {
                name: "tcp",
                dport: Some(80)
            }]
        );
    }
}
