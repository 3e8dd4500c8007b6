//! Preview 2's stats and listings for deterministic tasks (see [`super::files`]): the
//! component linker's `wasi:filesystem/types` functions that answer with host facts
//! (`stat`, `stat-at`, `metadata-hash`, `metadata-hash-at`, `read-directory` and its
//! stream's `read-directory-entry`) shadowed by functions that call wasmtime-wasi's own
//! and replace those facts. A guest built for wasm32-wasip2 that makes preview-1 calls
//! reaches these through its adapter.

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView, WasiFilesystemView as _};
use wasmtime_wasi::p2::bindings::clocks::wall_clock::Datetime;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorStat, DescriptorType, DirectoryEntry, ErrorCode, HostDescriptor as _,
    HostDirectoryEntryStream as _, MetadataHashValue, PathFlags,
};
use wasmtime_wasi::p2::{FsResult, ReaddirIterator};

use super::ComponentCtx;
use super::files::{FILE_TIME_NS, FixedFiles, LINKS, Listing, SortedEntries};

/// The interface, at the version wasmtime-wasi defines it (a guest importing an older
/// 0.2 version is linked to it).
const TYPES: &str = "wasi:filesystem/types@0.2.12";

type Answer<T> = wasmtime::Result<(Result<T, ErrorCode>,)>;

/// Shadows the functions in `linker`, which must hold wasmtime-wasi's preview 2.
pub fn add_to_linker(linker: &mut Linker<ComponentCtx>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.stat",
        |mut store: StoreContextMut<'_, ComponentCtx>, (fd,): (Resource<Descriptor>,)| {
            Box::new(async move {
                let stat = store.data_mut().filesystem().stat(fd).await;
                answer(stat.map(fixed_stat))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.stat-at",
        |mut store: StoreContextMut<'_, ComponentCtx>,
         (fd, flags, path): (Resource<Descriptor>, PathFlags, String)| {
            Box::new(async move {
                let stat = store.data_mut().filesystem().stat_at(fd, flags, path).await;
                answer(stat.map(fixed_stat))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.metadata-hash",
        |mut store: StoreContextMut<'_, ComponentCtx>, (fd,): (Resource<Descriptor>,)| {
            Box::new(async move {
                let ctx = store.data_mut();
                let hash = ctx.filesystem().metadata_hash(fd).await;
                fixed_hash(ctx, hash).await
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.metadata-hash-at",
        |mut store: StoreContextMut<'_, ComponentCtx>,
         (fd, flags, path): (Resource<Descriptor>, PathFlags, String)| {
            Box::new(async move {
                let ctx = store.data_mut();
                let hash = ctx.filesystem().metadata_hash_at(fd, flags, path).await;
                fixed_hash(ctx, hash).await
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.read-directory",
        |mut store: StoreContextMut<'_, ComponentCtx>, (fd,): (Resource<Descriptor>,)| {
            Box::new(async move { read_directory(store.data_mut(), fd).await })
        },
    )?;
    types.func_wrap_async(
        "[method]directory-entry-stream.read-directory-entry",
        |mut store: StoreContextMut<'_, ComponentCtx>, (stream,): (Resource<ReaddirIterator>,)| {
            Box::new(async move { read_directory_entry(store.data_mut(), stream).await })
        },
    )?;
    Ok(())
}

/// A host call's result as the component sees it: a filesystem error is the guest's to
/// handle, anything else traps (as wasmtime-wasi's own bindings do).
fn answer<T>(result: FsResult<T>) -> Answer<T> {
    match result {
        Ok(value) => Ok((Ok(value),)),
        Err(e) => Ok((Err(e.downcast()?),)),
    }
}

fn fixed_stat(stat: DescriptorStat) -> DescriptorStat {
    let time = Some(Datetime {
        seconds: FILE_TIME_NS / 1_000_000_000,
        nanoseconds: (FILE_TIME_NS % 1_000_000_000) as u32,
    });
    DescriptorStat {
        link_count: LINKS,
        size: match stat.type_ {
            DescriptorType::Directory => 0,
            _ => stat.size,
        },
        data_access_timestamp: time,
        data_modification_timestamp: time,
        status_change_timestamp: time,
        type_: stat.type_,
    }
}

/// The attempt's listing, made on first use. Taken out of the context while it is made,
/// since making it borrows the whole context's filesystem view.
async fn with_listing<T>(
    ctx: &mut ComponentCtx,
    f: impl FnOnce(&Listing) -> T,
) -> wasmtime::Result<T> {
    if ctx.files.listing.is_none() {
        let built = Listing::build(&mut ctx.filesystem()).await?;
        ctx.files.listing = Some(built);
    }
    Ok(f(ctx.files.listing.as_ref().expect("built above")))
}

async fn fixed_hash(
    ctx: &mut ComponentCtx,
    hash: FsResult<MetadataHashValue>,
) -> Answer<MetadataHashValue> {
    let host = match hash {
        Ok(hash) => hash.lower,
        Err(e) => return answer(Err(e)),
    };
    let (lower, upper) = with_listing(ctx, |listing| listing.inode(host)).await?;
    Ok((Ok(MetadataHashValue { lower, upper }),))
}

/// wasmtime-wasi's stream, read to its end here and kept sorted by name for the guest's
/// reads; the guest still holds (and drops) wasmtime-wasi's own handle.
async fn read_directory(
    ctx: &mut ComponentCtx,
    fd: Resource<Descriptor>,
) -> Answer<Resource<ReaddirIterator>> {
    let mut fs = ctx.filesystem();
    let stream = match fs.read_directory(fd).await {
        Ok(stream) => stream,
        Err(e) => return answer(Err(e)),
    };
    let entries = drain(&mut fs, stream.rep()).await?;
    ctx.files.streams.insert(stream.rep(), entries);
    Ok((Ok(stream),))
}

async fn drain(fs: &mut WasiFilesystemCtxView<'_>, stream: u32) -> wasmtime::Result<SortedEntries> {
    let mut entries: Vec<DirectoryEntry> = Vec::new();
    let mut ended_in = None;
    loop {
        match fs.read_directory_entry(Resource::new_borrow(stream)).await {
            Ok(Some(entry)) => entries.push(entry),
            Ok(None) => break,
            Err(e) => {
                ended_in = Some(e.downcast()?);
                break;
            }
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries
        .into_iter()
        .map(Ok)
        .chain(ended_in.map(Err))
        .collect())
}

async fn read_directory_entry(
    ctx: &mut ComponentCtx,
    stream: Resource<ReaddirIterator>,
) -> Answer<Option<DirectoryEntry>> {
    let FixedFiles { streams, .. } = &mut ctx.files;
    match streams.get_mut(&stream.rep()) {
        Some(entries) => match entries.pop_front() {
            Some(Ok(entry)) => Ok((Ok(Some(entry)),)),
            Some(Err(code)) => Ok((Err(code),)),
            None => Ok((Ok(None),)),
        },
        // Every stream comes from `read_directory` above; should one not, it is
        // wasmtime-wasi's to answer.
        None => answer(ctx.filesystem().read_directory_entry(stream).await),
    }
}
