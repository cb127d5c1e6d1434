//! Point lookups of our sets' elements over netlink (NFT_MSG_GETSETELEM without a dump): the
//! periodic check's way into sets too large to dump.

use super::netlink::{data_text, fields_text, Fields};
use super::tables::{family_name, TABLE};
use crate::model::IpFamily;
use crate::netlink::*;

/// How many keys one lookup request asks for. The kernel answers each element found with a
/// message of its own, all queued on our socket before we read any, and an answer it cannot
/// queue fails the request: 32 to a request keep far from the receive buffer's limit.
const LOOKUP_REQUEST: usize = 32;

/// What [`look_up_on`] found for each key: its value (`Some(None)` in a plain set), or
/// `None` when the kernel holds no element with that key.
pub type Found = Vec<Option<Option<String>>>;

/// The elements of our set `name` in `family` with `keys` (canonical text), asked on
/// `socket` one key at a time (NFT_MSG_GETSETELEM without a dump): linear in `keys`, where
/// a dump of a large set is quadratic in its size (see `NftBackend`'s read limit). Not for
/// interval sets, whose elements are ranges.
pub fn look_up_on(
    socket: &mut Socket,
    family: IpFamily,
    name: &str,
    keys: &[&str],
) -> Result<Found, NetlinkError> {
    let layout = Fields::of(name, family);
    let what = format!("lookup in {name} of {} {TABLE}", family_name(family));
    let mut out: Found = Vec::with_capacity(keys.len());
    while out.len() < keys.len() {
        let chunk = &keys[out.len()..keys.len().min(out.len() + LOOKUP_REQUEST)];
        let mut q = Vec::new();
        let mut a = Attrs(&mut q);
        a.str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
        a.str(NFTA_SET_ELEM_LIST_SET, name);
        let mut unfit = None;
        a.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |l| {
            for key in chunk {
                match super::wire::elements::encode_fields(key, &layout.key, layout.addr_len) {
                    Some(bytes) => l.nest(NFTA_LIST_ELEM, |e| {
                        e.nest(NFTA_SET_ELEM_KEY, |k| k.put(NFTA_DATA_VALUE, &bytes))
                    }),
                    None => unfit = Some(*key),
                }
            }
        });
        if let Some(key) = unfit {
            return Err(socket.malformed(&what, &format!("key {key:?} does not fit the set")));
        }
        // The kernel answers in the order asked, and stops at the first key it lacks.
        let mut answers: Vec<(String, Option<String>)> = Vec::new();
        let request = Request::nfnl(
            NFNL_SUBSYS_NFTABLES,
            NFT_MSG_GETSETELEM,
            NLM_F_ACK,
            nfproto(family),
            &q,
        );
        let result = socket.request_each(&what, &request, &mut |body| {
            let elem =
                find(body, NFTA_SET_ELEM_LIST_ELEMENTS).and_then(|l| find(l, NFTA_LIST_ELEM));
            let key = elem
                .and_then(|e| find(e, NFTA_SET_ELEM_KEY))
                .and_then(|k| find(k, NFTA_DATA_VALUE))
                .map(|k| fields_text(k, &layout.key, layout.addr_len));
            let value = elem
                .and_then(|e| find(e, NFTA_SET_ELEM_DATA))
                .map(|d| data_text(d, &layout.value, layout.addr_len));
            answers.push((key.unwrap_or_default(), value));
        });
        let answered = answers.len();
        for ((key, value), asked) in answers.into_iter().zip(chunk) {
            if key != *asked {
                let detail = format!("asked for {asked:?}, the kernel answered {key:?}");
                return Err(socket.malformed(&what, &detail));
            }
            out.push(Some(value));
        }
        match result {
            Ok(()) if answered == chunk.len() => {}
            // ENOENT: the next key asked is not in the set.
            Err(NetlinkError::Kernel { errno: 2, .. }) if answered < chunk.len() => out.push(None),
            Ok(()) => return Err(socket.malformed(&what, "fewer answers than keys")),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}
