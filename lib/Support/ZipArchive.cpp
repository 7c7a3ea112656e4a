//===- ZipArchive.cpp - Read entries of a zip archive with minizip --------===//

#include "hpr/Support/ZipArchive.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cstring>

#include <minizip/unzip.h>

using namespace mlir::hpr;

struct ZipArchive::Impl {
  /// The archive's bytes, read through minizip's I/O interface (ioapi.h): the
  /// archive is opened from memory, where the importers have it already.
  struct MemoryStream {
    llvm::StringRef data;
    uint64_t position = 0;

    static voidpf open(voidpf opaque, const void *, int) { return opaque; }
    static uLong read(voidpf, voidpf stream, void *buffer, uLong size) {
      auto *self = static_cast<MemoryStream *>(stream);
      uint64_t count = std::min<uint64_t>(
          size, self->data.size() -
                    std::min<uint64_t>(self->position, self->data.size()));
      std::memcpy(buffer, self->data.data() + self->position, count);
      self->position += count;
      return uLong(count);
    }
    static uLong write(voidpf, voidpf, const void *, uLong) { return 0; }
    static ZPOS64_T tell(voidpf, voidpf stream) {
      return static_cast<MemoryStream *>(stream)->position;
    }
    static long seek(voidpf, voidpf stream, ZPOS64_T offset, int origin) {
      auto *self = static_cast<MemoryStream *>(stream);
      uint64_t base = origin == ZLIB_FILEFUNC_SEEK_SET   ? 0
                      : origin == ZLIB_FILEFUNC_SEEK_CUR ? self->position
                                                         : self->data.size();
      if (offset >
          self->data.size() - std::min<uint64_t>(base, self->data.size()))
        return -1;
      self->position = base + offset;
      return 0;
    }
    static int close(voidpf, voidpf) { return 0; }
    static int error(voidpf, voidpf) { return 0; }
  };

  MemoryStream stream;
  unzFile archive = nullptr;
  ~Impl() {
    if (archive)
      unzClose(archive);
  }
};

static llvm::Error zipError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

/// What a minizip status means, in words.
static std::string statusText(int status) {
  switch (status) {
  case UNZ_CRCERROR:
    return "CRC error";
  case UNZ_BADZIPFILE:
    return "its local header disagrees with the central directory, or it is "
           "stored with a method other than store or deflate";
  case Z_DATA_ERROR:
    return "its compressed data is invalid";
  case Z_MEM_ERROR:
    return "out of memory while inflating it";
  default:
    return llvm::formatv("minizip status {0}", status).str();
  }
}

/// The current entry's directory record and name: the record first, for the
/// name's length (an archive lists hundreds of entries; no 64 KiB buffer each).
static int currentEntry(unzFile archive, unz_file_info64 &info,
                        std::string &name) {
  int status = unzGetCurrentFileInfo64(archive, &info, nullptr, 0, nullptr, 0,
                                       nullptr, 0);
  if (status != UNZ_OK)
    return status;
  name.assign(info.size_filename, '\0');
  return unzGetCurrentFileInfo64(archive, &info, name.data(), name.size(),
                                 nullptr, 0, nullptr, 0);
}

ZipArchive::ZipArchive(std::unique_ptr<Impl> impl,
                       std::vector<std::string> names, std::string fileName)
    : impl(std::move(impl)), entryNames(std::move(names)),
      fileName(std::move(fileName)) {}
ZipArchive::ZipArchive(ZipArchive &&) noexcept = default;
ZipArchive &ZipArchive::operator=(ZipArchive &&) noexcept = default;
ZipArchive::~ZipArchive() = default;

llvm::Expected<ZipArchive> ZipArchive::open(llvm::StringRef data,
                                            llvm::StringRef fileName,
                                            llvm::StringRef kind) {
  auto fail = [&](const llvm::Twine &why) {
    return zipError(fileName + ": not a valid " + kind + " (" + why + ")");
  };
  if (data.empty())
    return fail("the file is empty");
  auto impl = std::make_unique<Impl>();
  impl->stream.data = data;
  using Stream = Impl::MemoryStream;
  zlib_filefunc64_def io = {Stream::open,  Stream::read, Stream::write,
                            Stream::tell,  Stream::seek, Stream::close,
                            Stream::error, &impl->stream};
  std::string path = fileName.str();
  impl->archive = unzOpen2_64(path.c_str(), &io);
  if (!impl->archive) {
    // A zip's directory sits at its end: with the local header magic at the
    // start but no directory, the file was most likely cut short.
    if (data.starts_with(llvm::StringRef("PK\x03\x04", 4)))
      return fail("no central directory at the end: truncated?");
    return fail("no zip header");
  }
  // The directory, entry by entry: names once each (a reader that picks one
  // of two entries of the same name reads what another tool would not).
  std::vector<std::string> names;
  llvm::StringSet<> seen;
  int status = unzGoToFirstFile(impl->archive);
  for (; status == UNZ_OK; status = unzGoToNextFile(impl->archive)) {
    unz_file_info64 info;
    std::string name;
    if ((status = currentEntry(impl->archive, info, name)) != UNZ_OK)
      break;
    if (!seen.insert(name).second)
      return fail("duplicate entry " + name + " in the archive");
    names.push_back(std::move(name));
  }
  if (status != UNZ_END_OF_LIST_OF_FILE)
    return fail(llvm::formatv("its central directory is damaged after {0} "
                              "entries",
                              names.size()));
  return ZipArchive(std::move(impl), std::move(names), fileName.str());
}

llvm::Expected<std::string> ZipArchive::read(llvm::StringRef name,
                                             uint64_t maxBytes) {
  std::string key = name.str();
  unz_file_info64 info;
  std::string recorded;
  if (unzLocateFile(impl->archive, key.c_str(), /*iCaseSensitivity=*/1) !=
          UNZ_OK ||
      currentEntry(impl->archive, info, recorded) != UNZ_OK)
    return zipError(fileName + ": the archive has no entry '" + name + "'");
  uint64_t size = info.uncompressed_size;
  // The bounds, from the directory first.
  uint64_t left = kMaxInflatedBytes - inflatedBytes;
  if (size > std::min(maxBytes, left))
    return zipError(
        maxBytes < left
            ? llvm::formatv("{0}: entry '{1}' is {2} bytes, more than the {3} "
                            "this reader accepts",
                            fileName, name, size, maxBytes)
                  .str()
            : llvm::formatv("{0}: entry '{1}' is {2} bytes, more than the {3} "
                            "left of the {4} this reader inflates from one "
                            "archive",
                            fileName, name, size, left, kMaxInflatedBytes)
                  .str());
  if (info.compression_method != 0 && size > kRatioFloor &&
      size / std::max<uint64_t>(info.compressed_size, 1) >= kMaxRatio)
    return zipError(llvm::formatv(
        "{0}: entry '{1}' inflates {2} compressed bytes to {3}, more than "
        "{4} times; refused as a likely zip bomb",
        fileName, name, info.compressed_size, size, kMaxRatio));
  if (int status = unzOpenCurrentFile(impl->archive); status != UNZ_OK)
    return zipError(fileName + ": cannot open entry '" + name +
                    "': " + statusText(status));
  // Then while inflating: memory follows the bytes that arrive, in chunks.
  // minizip stops at the recorded size and checks the CRC on close when the
  // entry was read to its end; fewer bytes than recorded is damage too.
  constexpr uint64_t kChunk = uint64_t(1) << 20;
  std::string bytes;
  int n = 0;
  while (bytes.size() < size) {
    size_t done = bytes.size();
    bytes.resize(done + std::min<uint64_t>(kChunk, size - done));
    n = unzReadCurrentFile(impl->archive, bytes.data() + done,
                           unsigned(bytes.size() - done));
    bytes.resize(done + std::max(n, 0));
    if (n <= 0)
      break;
  }
  int closed = unzCloseCurrentFile(impl->archive);
  std::string why = n < 0                  ? statusText(n)
                    : bytes.size() != size ? "short read"
                    : closed != UNZ_OK     ? statusText(closed)
                                           : "";
  if (!why.empty())
    return zipError(fileName + ": entry '" + name + "' is damaged: " + why);
  inflatedBytes += bytes.size();
  return bytes;
}
