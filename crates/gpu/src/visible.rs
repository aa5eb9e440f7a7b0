//! [`VisibleDevices`]: which GPUs this process may use, from `CUDA_VISIBLE_DEVICES` or
//! `NVIDIA_VISIBLE_DEVICES`.
//!
//! - `CUDA_VISIBLE_DEVICES` wins when set. Entries are NVML indices or (prefixes of) `GPU-…`
//!   UUIDs; as in CUDA, the list stops at the first invalid entry, and an empty value means no
//!   device. Indices are matched in NVML (PCI bus) order, which equals CUDA's order only with
//!   `CUDA_DEVICE_ORDER=PCI_BUS_ID`: prefer UUIDs. `MIG-…` entries are skipped (MIG instances share
//!   their parent's counters, which cannot be attributed per instance).
//! - `NVIDIA_VISIBLE_DEVICES` is read by the container runtime, which already hides the other GPUs
//!   from NVML inside the container and renumbers the rest from 0; so its index lists are applied
//!   only when NVML sees more devices than the list names (a bare-metal process with the variable
//!   set). `all` means every device; `none`, `void` and empty mean none.
//! - Neither set: every device.

use crate::source::DeviceInfo;

/// One entry of a visible-devices list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSelector {
    /// An NVML index.
    Index(u32),
    /// A `GPU-…` UUID or a unique prefix of one (compared case-insensitively).
    Uuid(String),
}

/// Which devices the sampler reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum VisibleDevices {
    /// Every device NVML reports.
    #[default]
    All,
    /// No device.
    None,
    /// These devices, in this order.
    List(Vec<DeviceSelector>),
    /// A list from `NVIDIA_VISIBLE_DEVICES`: applied only when NVML sees more devices than it names.
    ContainerList(Vec<DeviceSelector>),
}

/// Environment variable CUDA reads.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// Environment variable the NVIDIA container runtime reads.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// Whether `s` is longer than `prefix` and starts with it, ignoring ASCII case.
fn has_prefix(s: &str, prefix: &str) -> bool {
    s.len() > prefix.len()
        && s.get(..prefix.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
}

fn parse_list(value: &str, stop_at_invalid: bool) -> Vec<DeviceSelector> {
    let mut out = Vec::new();
    for entry in value.split(',').map(str::trim) {
        if let Ok(i) = entry.parse::<i64>() {
            match u32::try_from(i) {
                Ok(i) => out.push(DeviceSelector::Index(i)),
                // CUDA treats a negative index as the end of the list.
                Err(_) => break,
            }
        } else if has_prefix(entry, "GPU-") {
            out.push(DeviceSelector::Uuid(entry.to_ascii_lowercase()));
        } else if has_prefix(entry, "MIG-") {
            continue;
        } else if stop_at_invalid {
            break;
        }
    }
    out
}

impl VisibleDevices {
    /// Parses a `CUDA_VISIBLE_DEVICES` value.
    pub fn parse_cuda(value: &str) -> Self {
        let v = value.trim();
        if v.eq_ignore_ascii_case("all") {
            return Self::All;
        }
        if v.is_empty() || v.eq_ignore_ascii_case("none") {
            return Self::None;
        }
        Self::List(parse_list(v, true))
    }

    /// Parses a `NVIDIA_VISIBLE_DEVICES` value.
    pub fn parse_nvidia(value: &str) -> Self {
        let v = value.trim();
        if v.eq_ignore_ascii_case("all") {
            return Self::All;
        }
        if v.is_empty() || v.eq_ignore_ascii_case("none") || v.eq_ignore_ascii_case("void") {
            return Self::None;
        }
        Self::ContainerList(parse_list(v, false))
    }

    /// From the environment: `CUDA_VISIBLE_DEVICES`, else `NVIDIA_VISIBLE_DEVICES`, else all.
    pub fn from_env() -> Self {
        Self::from_vars(
            std::env::var(CUDA_VISIBLE_DEVICES).ok().as_deref(),
            std::env::var(NVIDIA_VISIBLE_DEVICES).ok().as_deref(),
        )
    }

    /// From the two variables' values.
    pub fn from_vars(cuda: Option<&str>, nvidia: Option<&str>) -> Self {
        match (cuda, nvidia) {
            (Some(c), _) => Self::parse_cuda(c),
            (None, Some(n)) => Self::parse_nvidia(n),
            (None, None) => Self::All,
        }
    }

    /// Positions in `devices` of the visible ones, in list order, without duplicates.
    pub fn select(&self, devices: &[DeviceInfo]) -> Vec<usize> {
        let list = match self {
            Self::All => return (0..devices.len()).collect(),
            Self::None => return Vec::new(),
            Self::ContainerList(list) if list.len() >= devices.len() => {
                return (0..devices.len()).collect();
            }
            Self::List(list) | Self::ContainerList(list) => list,
        };
        let mut out: Vec<usize> = Vec::with_capacity(list.len());
        for selector in list {
            let found = match selector {
                DeviceSelector::Index(i) => devices.iter().position(|d| d.index == *i),
                DeviceSelector::Uuid(prefix) => {
                    let mut matches = devices.iter().enumerate().filter(|(_, d)| {
                        d.uuid
                            .get(..prefix.len())
                            .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
                    });
                    match (matches.next(), matches.next()) {
                        (Some((pos, _)), None) => Some(pos),
                        _ => None, // absent or ambiguous
                    }
                }
            };
            if let Some(pos) = found
                && !out.contains(&pos)
            {
                out.push(pos);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices() -> Vec<DeviceInfo> {
        vec![
            DeviceInfo::new(0, "GPU-aaaa1111-0000", "H200"),
            DeviceInfo::new(1, "GPU-bbbb2222-0000", "H200"),
            DeviceInfo::new(2, "GPU-bbbb3333-0000", "H200"),
        ]
    }

    #[test]
    fn unset_means_all() {
        assert_eq!(VisibleDevices::from_vars(None, None), VisibleDevices::All);
        assert_eq!(VisibleDevices::All.select(&devices()), vec![0, 1, 2]);
    }

    #[test]
    fn cuda_wins_over_nvidia() {
        let v = VisibleDevices::from_vars(Some("2"), Some("all"));
        assert_eq!(v.select(&devices()), vec![2]);
    }

    #[test]
    fn cuda_indices_keep_order_and_stop_at_the_first_invalid_entry() {
        let v = VisibleDevices::parse_cuda("2, 0, -1, 1");
        assert_eq!(v.select(&devices()), vec![2, 0]);
        let v = VisibleDevices::parse_cuda("1,bogus,2");
        assert_eq!(v.select(&devices()), vec![1]);
        // An index NVML does not have selects nothing.
        assert!(
            VisibleDevices::parse_cuda("7")
                .select(&devices())
                .is_empty()
        );
    }

    #[test]
    fn uuids_and_unique_prefixes() {
        let v = VisibleDevices::parse_cuda("GPU-AAAA1111-0000,GPU-bbbb3");
        assert_eq!(v.select(&devices()), vec![0, 2]);
        // Ambiguous prefix matches nothing.
        assert!(
            VisibleDevices::parse_cuda("GPU-bbbb")
                .select(&devices())
                .is_empty()
        );
    }

    #[test]
    fn empty_none_void() {
        assert_eq!(VisibleDevices::parse_cuda(""), VisibleDevices::None);
        assert_eq!(VisibleDevices::parse_cuda("none"), VisibleDevices::None);
        assert_eq!(VisibleDevices::parse_nvidia("void"), VisibleDevices::None);
        assert_eq!(VisibleDevices::parse_nvidia("ALL"), VisibleDevices::All);
        assert!(VisibleDevices::None.select(&devices()).is_empty());
    }

    #[test]
    fn non_ascii_entries_do_not_panic() {
        assert!(
            VisibleDevices::parse_cuda("GP€U-1,0")
                .select(&devices())
                .is_empty()
        );
        let v = VisibleDevices::parse_nvidia("GPU-ü,0");
        assert_eq!(v.select(&devices()), vec![0]);
    }

    #[test]
    fn mig_entries_are_skipped_duplicates_removed() {
        let v = VisibleDevices::parse_cuda("MIG-1234,1,1");
        assert_eq!(v.select(&devices()), vec![1]);
    }

    #[test]
    fn container_lists_apply_only_when_nvml_sees_more_devices() {
        // Inside a container given host GPU 3: NVML sees one device, index 0.
        let inside = vec![DeviceInfo::new(0, "GPU-cccc", "H200")];
        assert_eq!(VisibleDevices::parse_nvidia("3").select(&inside), vec![0]);
        // On the host with the variable set: applied.
        assert_eq!(
            VisibleDevices::parse_nvidia("1").select(&devices()),
            vec![1]
        );
        assert_eq!(
            VisibleDevices::parse_nvidia("GPU-bbbb3333").select(&devices()),
            vec![2]
        );
    }
}
