/* What a compiled FUSE daemon costs: a read-only mirror of a directory on libfuse's low-level API, one thread,
   `keep_cache` on every open, entries and attributes cached a day. bench/fuse_floor.py builds and runs it:
       mirror_ll SOURCE_DIR MOUNTPOINT    (foreground; unmount to stop) */
#define FUSE_USE_VERSION 34
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_INODES 1000000
#define TIMEOUT 86400.0

static char *paths[MAX_INODES + 2]; /* inode -> path; inode 1 is the root */
static fuse_ino_t inode_count = 1;

/* The inode of `path`: a linear search, fine for a benchmark (the kernel caches every entry after the first
   lookup, so this runs once per file). */
static fuse_ino_t intern(const char *path) {
    for (fuse_ino_t ino = 1; ino <= inode_count; ino++)
        if (!strcmp(paths[ino], path)) return ino;
    if (inode_count > MAX_INODES) return 0;
    paths[++inode_count] = strdup(path);
    return inode_count;
}

static void mirror_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    char path[4096];
    struct fuse_entry_param entry = {0};
    snprintf(path, sizeof path, "%s/%s", paths[parent], name);
    if (lstat(path, &entry.attr)) { fuse_reply_err(req, errno); return; }
    if (!(entry.ino = entry.attr.st_ino = intern(path))) { fuse_reply_err(req, ENOSPC); return; }
    entry.attr_timeout = entry.entry_timeout = TIMEOUT;
    fuse_reply_entry(req, &entry);
}

static void mirror_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct stat found;
    (void)fi;
    if (lstat(paths[ino], &found)) { fuse_reply_err(req, errno); return; }
    found.st_ino = ino;
    fuse_reply_attr(req, &found, TIMEOUT);
}

static void mirror_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    DIR *dir = opendir(paths[ino]);
    if (!dir) { fuse_reply_err(req, errno); return; }
    fi->fh = (uint64_t)(uintptr_t)dir;
    fuse_reply_open(req, fi);
}

static void mirror_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, struct fuse_file_info *fi) {
    DIR *dir = (DIR *)(uintptr_t)fi->fh;
    char *buffer = calloc(1, size);
    size_t used = 0;
    struct dirent *entry;
    (void)ino;
    seekdir(dir, offset);
    while ((entry = readdir(dir))) {
        struct stat attributes = {.st_mode = (mode_t)entry->d_type << 12};
        size_t needed = fuse_add_direntry(req, buffer + used, size - used, entry->d_name, &attributes, telldir(dir));
        if (needed > size - used) break;
        used += needed;
    }
    fuse_reply_buf(req, buffer, used);
    free(buffer);
}

static void mirror_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    closedir((DIR *)(uintptr_t)fi->fh);
    fuse_reply_err(req, 0);
}

static void mirror_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    int fd = open(paths[ino], O_RDONLY);
    if (fd < 0) { fuse_reply_err(req, errno); return; }
    fi->fh = (uint64_t)fd;
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
}

static void mirror_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, struct fuse_file_info *fi) {
    char *buffer = malloc(size);
    ssize_t got = pread((int)fi->fh, buffer, size, offset);
    (void)ino;
    if (got < 0) fuse_reply_err(req, errno); else fuse_reply_buf(req, buffer, (size_t)got);
    free(buffer);
}

static void mirror_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    close((int)fi->fh);
    fuse_reply_err(req, 0);
}

static const struct fuse_lowlevel_ops operations = {
    .lookup = mirror_lookup, .getattr = mirror_getattr, .opendir = mirror_opendir, .readdir = mirror_readdir,
    .releasedir = mirror_releasedir, .open = mirror_open, .read = mirror_read, .release = mirror_release,
};

int main(int argc, char **argv) {
    char *options[] = {argv[0], "-o", "ro,fsname=mirror_ll"};
    struct fuse_args args = FUSE_ARGS_INIT(3, options);
    struct fuse_session *session;
    int status;
    if (argc != 3) { fprintf(stderr, "usage: %s SOURCE_DIR MOUNTPOINT\n", argv[0]); return 2; }
    paths[1] = realpath(argv[1], NULL);
    if (!paths[1]) { perror(argv[1]); return 2; }
    session = fuse_session_new(&args, &operations, sizeof operations, NULL);
    if (!session || fuse_session_mount(session, argv[2])) return 1;
    status = fuse_session_loop(session);
    fuse_session_unmount(session);
    fuse_session_destroy(session);
    return status;
}
