//===- ZipArchive.cpp - Read entries of a zip archive with libzip ---------===//

#include "hpr/Support/ZipArchive.h"

#include "llvm/Support/FormatVariadic.h"

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
  auto fail = [&](llvm::StringRef why) {
    llvm::Error err =
        zipError(fileName + ": not a valid " + kind + " (" + why + ")");
    zip_error_fini(&error);
    return err;
  };
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
  if (stat.size > maxBytes)
    return zipError(llvm::formatv("{0}: entry '{1}' is {2} bytes, more than "
                                  "the {3} this reader accepts",
                                  fileName, name, stat.size, maxBytes));
  zip_file_t *file = zip_fopen(impl->archive, key.c_str(), ZIP_FL_ENC_RAW);
  if (!file)
    return zipError(fileName + ": cannot open entry '" + name +
                    "': " + zip_strerror(impl->archive));
  std::string bytes(stat.size, '\0');
  zip_uint64_t done = 0;
  while (done < stat.size) {
    zip_int64_t n = zip_fread(file, bytes.data() + done, stat.size - done);
    if (n <= 0)
      break;
    done += zip_uint64_t(n);
  }
  // libzip compares the CRC when a read reaches the end of the entry, so
  // read once more: it must report the end (0), not an error.
  char extra;
  bool complete =
      done == stat.size && zip_fread(file, &extra, sizeof(extra)) == 0;
  std::string why = complete ? "" : zip_file_strerror(file);
  zip_fclose(file);
  if (!complete)
    return zipError(fileName + ": entry '" + name +
                    "' is damaged: " + (why.empty() ? "short read" : why));
  return bytes;
}
