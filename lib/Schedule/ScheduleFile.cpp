//===- ScheduleFile.cpp - Read a schedule file by extension ---------------===//

#include "hpr/Schedule/ScheduleFile.h"
#include "hpr/Schedule/ScheduleJson.h"
#include "hpr/Support/InputFile.h"

#include "llvm/Support/Path.h"

namespace mlir::hpr::sched {

llvm::Expected<Schedule> readScheduleFile(llvm::StringRef path,
                                          CsvDialect dialect) {
  std::string ext = llvm::sys::path::extension(path).lower();
  if (ext != ".csv" && ext != ".json")
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        "%s: unknown schedule file extension '%s': expected .csv or .json",
        path.str().c_str(), ext.c_str());
  auto buffer = readInputFile(path, "schedule file");
  if (!buffer)
    return buffer.takeError();
  llvm::StringRef text = (*buffer)->getBuffer();
  if (ext == ".json")
    return parseScheduleJson(text, path);
  return parseScheduleCsv(text, path, dialect);
}

} // namespace mlir::hpr::sched
