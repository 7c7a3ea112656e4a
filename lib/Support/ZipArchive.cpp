//===- ZipArchive.cpp - Read entries of a zip archive with libzip ---------===//

#include "hpr/Support/ZipArchive.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

#include <zip.h>

using namespace mlir::hpr;

struct ZipArchive::Impl {
  zip_t *archive = nullptr;
  ~Impl() {
    if (archive)
      zip_discard(archive); // read-only: nothing to write back
  }
};

static llvm::Error zipError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

/// The first name the central directory of \p data lists twice, or "" when
/// it cannot be found (libzip refuses such an archive without naming it).
/// Layout: PKWARE's APPNOTE.TXT, 4.3.12 to 4.3.16 (zip64 included).
static std::string duplicateEntry(llvm::StringRef data) {
  auto u16 = [&](size_t at) -> uint64_t {
    return at + 2 <= data.size()
               ? llvm::support::endian::read16le(data.data() + at)
               : 0;
  };
  auto u32 = [&](size_t at) -> uint64_t {
    return at + 4 <= data.size()
               ? llvm::support::endian::read32le(data.data() + at)
               : 0;
  };
  auto u64 = [&](size_t at) -> uint64_t {
    return at + 8 <= data.size()
               ? llvm::support::endian::read64le(data.data() + at)
               : 0;
  };
  // The end of central directory record, within its comment's reach (64 KiB)
  // of the end.
  size_t end = data.rfind(llvm::StringRef("PK\x05\x06", 4));
  if (end == llvm::StringRef::npos || data.size() - end > 22 + 0xFFFF)
    return "";
  uint64_t count = u16(end + 10), offset = u32(end + 16);
  if (offset == 0xFFFFFFFF && end >= 20 &&
      data.substr(end - 20, 4) == llvm::StringRef("PK\x06\x07", 4)) {
    uint64_t record = u64(end - 20 + 8);
    if (record < data.size() &&
        data.substr(record, 4) == llvm::StringRef("PK\x06\x06", 4)) {
      count = u64(record + 32);
      offset = u64(record + 48);
    }
  }
  llvm::StringSet<> seen;
  for (uint64_t i = 0; i < count && offset < data.size(); ++i) {
    if (data.substr(offset, 4) != llvm::StringRef("PK\x01\x02", 4))
      return "";
    uint64_t nameLength = u16(offset + 28);
    llvm::StringRef name = data.substr(offset + 46, nameLength);
    if (!seen.insert(name).second)
      return name.str();
    offset += 46 + nameLength + u16(offset + 30) + u16(offset + 32);
  }
  return "";
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
  zip_error_t error;
  zip_error_init(&error);
  auto fail = [&](const llvm::Twine &why) {
    llvm::Error err =
        zipError(fileName + ": not a valid " + kind + " (" + why + ")");
    zip_error_fini(&error);
    return err;
  };
  // libzip opens an empty buffer as an archive without entries.
  if (data.empty())
    return fail("the file is empty");
  zip_source_t *source =
      zip_source_buffer_create(data.data(), data.size(), 0, &error);
  if (!source)
    return fail(zip_error_strerror(&error));
  auto impl = std::make_unique<Impl>();
  impl->archive =
      zip_open_from_source(source, ZIP_RDONLY | ZIP_CHECKCONS, &error);
  if (!impl->archive) {
    zip_source_free(source);
    // A zip's directory sits at its end: with the local header magic at the
    // start but no directory, the file was most likely cut short.
    if (zip_error_code_zip(&error) == ZIP_ER_NOZIP &&
        data.starts_with(llvm::StringRef("PK\x03\x04", 4)))
      return fail("no central directory at the end: truncated?");
    if (zip_error_code_zip(&error) == ZIP_ER_NOZIP)
      return fail("no zip header");
    if (zip_error_code_zip(&error) == ZIP_ER_EXISTS) {
      std::string name = duplicateEntry(data);
      return fail(name.empty() ? "duplicate entry names in the archive"
                               : "duplicate entry " + name + " in the archive");
    }
    return fail(zip_error_strerror(&error));
  }
  zip_error_fini(&error);
  std::vector<std::string> names;
  zip_int64_t count = zip_get_num_entries(impl->archive, 0);
  for (zip_int64_t i = 0; i < count; ++i)
    if (const char *name = zip_get_name(impl->archive, i, ZIP_FL_ENC_RAW))
      names.emplace_back(name);
  return ZipArchive(std::move(impl), std::move(names), fileName.str());
}

llvm::Expected<std::string> ZipArchive::read(llvm::StringRef name,
                                             uint64_t maxBytes) {
  std::string key = name.str();
  zip_stat_t stat;
  zip_stat_init(&stat);
  if (zip_stat(impl->archive, key.c_str(), ZIP_FL_ENC_RAW, &stat) != 0 ||
      !(stat.valid & ZIP_STAT_SIZE))
    return zipError(fileName + ": the archive has no entry '" + name + "'");
  // The bounds, from the directory first.
  uint64_t left = kMaxInflatedBytes - inflatedBytes;
  if (stat.size > std::min(maxBytes, left))
    return zipError(
        maxBytes < left
            ? llvm::formatv("{0}: entry '{1}' is {2} bytes, more than the {3} "
                            "this reader accepts",
                            fileName, name, stat.size, maxBytes)
                  .str()
            : llvm::formatv("{0}: entry '{1}' is {2} bytes, more than the {3} "
                            "left of the {4} this reader inflates from one "
                            "archive",
                            fileName, name, stat.size, left, kMaxInflatedBytes)
                  .str());
  if ((stat.valid & ZIP_STAT_COMP_SIZE) &&
      (stat.valid & ZIP_STAT_COMP_METHOD) && stat.comp_method != ZIP_CM_STORE &&
      stat.size > kRatioFloor &&
      stat.size / std::max<uint64_t>(stat.comp_size, 1) >= kMaxRatio)
    return zipError(llvm::formatv(
        "{0}: entry '{1}' inflates {2} compressed bytes to {3}, more than "
        "{4} times; refused as a likely zip bomb",
        fileName, name, stat.comp_size, stat.size, kMaxRatio));
  zip_file_t *file = zip_fopen(impl->archive, key.c_str(), ZIP_FL_ENC_RAW);
  if (!file)
    return zipError(fileName + ": cannot open entry '" + name +
                    "': " + zip_strerror(impl->archive));
  // Then while inflating: memory follows the bytes that arrive, in chunks,
  // and one byte past the recorded size is an error. Reading on to the end
  // (0) makes libzip compare the entry's CRC.
  constexpr uint64_t kChunk = uint64_t(1) << 20;
  std::string bytes;
  zip_int64_t n = 0;
  while (bytes.size() <= stat.size) {
    size_t done = bytes.size();
    bytes.resize(done + std::min<uint64_t>(kChunk, stat.size + 1 - done));
    n = zip_fread(file, bytes.data() + done, bytes.size() - done);
    bytes.resize(done + std::max<zip_int64_t>(n, 0));
    if (n <= 0)
      break;
  }
  std::string why =
      n == 0 && bytes.size() == stat.size
          ? ""
          : (bytes.size() > stat.size
                 ? llvm::formatv("it inflates past the {0} "
                                 "bytes its directory records",
                                 stat.size)
                       .str()
                 : std::string(n < 0 ? zip_file_strerror(file) : "short read"));
  zip_fclose(file);
  if (!why.empty())
    return zipError(fileName + ": entry '" + name + "' is damaged: " + why);
  inflatedBytes += bytes.size();
  return bytes;
}
