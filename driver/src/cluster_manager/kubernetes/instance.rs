//! Which driver a pod is of: an id made once in the driver's data dir and put in every
//! pod's labels (`flint.dev/driver-instance`) and name. Its pods are what a driver
//! adopts at its start, watches, and deletes as leftovers or at a stop for good; two
//! drivers with the same app id (the default one, say) in one namespace each see only
//! their own, and a driver restarted on its data dir finds its pods again.

use std::path::Path;

use anyhow::Context;

/// The file in the driver's work root that holds the id.
const INSTANCE_FILE: &str = "driver-instance";

/// This driver's instance id: the one in `work_root` (made there, 32 hex digits, if it
/// is not yet), or, for a caller without a data dir, one derived from the address its
/// executors dial (two drivers cannot share that; a driver restarted to adopt its pods
/// keeps it, or its executors could not come back).
pub(crate) fn driver_instance(
    work_root: Option<&Path>,
    driver_url: &str,
) -> anyhow::Result<String> {
    let Some(work_root) = work_root else {
        return Ok(format!("url-{}", &super::pod::short_hash(&[driver_url])));
    };
    let path = work_root.join(INSTANCE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) if super::pod::is_label_value(text.trim()) && !text.trim().is_empty() => {
            return Ok(text.trim().to_owned());
        }
        Ok(text) => anyhow::bail!(
            "{} holds {:?}, which is no Kubernetes label value: delete it only if no executor \
             pod of this driver runs (a new id disowns them)",
            path.display(),
            text.trim()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let id = uuid::Uuid::now_v7().simple().to_string();
    std::fs::create_dir_all(work_root)
        .with_context(|| format!("creating {}", work_root.display()))?;
    // Written whole or not at all: a torn id would disown the pods.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{id}\n"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_is_made_once_per_data_dir_and_kept() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let first = driver_instance(Some(a.path()), "flint://x:1").unwrap();
        assert_eq!(first.len(), 32);
        assert_eq!(
            driver_instance(Some(a.path()), "flint://y:2").unwrap(),
            first
        );
        assert_ne!(
            driver_instance(Some(b.path()), "flint://x:1").unwrap(),
            first
        );
        let by_url = driver_instance(None, "flint://x:1").unwrap();
        assert_eq!(by_url, driver_instance(None, "flint://x:1").unwrap());
        assert_ne!(by_url, driver_instance(None, "flint://x:2").unwrap());
        std::fs::write(a.path().join(INSTANCE_FILE), "not a label!").unwrap();
        assert!(driver_instance(Some(a.path()), "flint://x:1").is_err());
    }
}
